"""Operator tools beside the command line: doctor, grant scripts, fleet probes, the SQL Server Agent
importer. Import the engine and below, never the command line or the monitor's pages."""
