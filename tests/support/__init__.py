"""Helpers the tests import (not tests): databases and agents, Azurite, a loopback ingestion
endpoint, faults, the monitor scenario, a T-SQL caller, the Bicep reader."""
