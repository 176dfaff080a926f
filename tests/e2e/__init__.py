"""End-to-end tests: several processes, the browser, the function app on Azurite."""
