"""The Job Activity Monitor: views (read models), pages, the HTTP application, the Azure Functions
adapter and the local server. Imports the engine and below, never the command line."""
