#!/usr/bin/env pwsh
# azd postprovision hook on Windows (azure.yaml): the same steps as postprovision.sh, which
# explains them. Open the SQL firewall for this machine, init-db, grant-sql --apply, then close
# the firewall again: always (finally), also when a step fails or the hook is interrupted.
#
# Reads the azd environment: AZURE_RESOURCE_GROUP and the template's outputs AZURE_SQL_SERVER_NAME,
# AGENT_SQL_SERVER, AGENT_SQL_DATABASE, AGENT_DATABASE_USER. The CLI runs as `python -m shared.cli`
# with the project's virtual environment (.venv\Scripts\python.exe; AGENT_PYTHON names another
# interpreter). Optional: AGENT_DEPLOYER_IP, AGENT_FIREWALL_RULE; AGENT_DB instead of
# AGENT_SQL_SERVER: a stand-in control database (grant-sql then prints the T-SQL). With
# AGENT_NETWORK_PROFILE private (the template's networkProfile) no firewall rule is made: the CLI
# reaches the server through its private endpoint, from inside the network.
$ErrorActionPreference = 'Stop'

Set-Location (Join-Path $PSScriptRoot (Join-Path '..' '..'))

function Fail([string] $Message) {
    [Console]::Error.WriteLine("postprovision: $Message")
    exit 1
}

$python = if ($env:AGENT_PYTHON) { $env:AGENT_PYTHON } elseif ($IsLinux -or $IsMacOS) { '.venv/bin/python' } else { '.venv\Scripts\python.exe' }
$rule = if ($env:AGENT_FIREWALL_RULE) { $env:AGENT_FIREWALL_RULE } else { 'azd-postprovision' }

if (-not $env:AZURE_RESOURCE_GROUP) { Fail 'AZURE_RESOURCE_GROUP is not set: expected the resource group azd deployed to (run this through azd provision or azd up)' }
if (-not $env:AZURE_SQL_SERVER_NAME) { Fail 'AZURE_SQL_SERVER_NAME is not set: expected the SQL server name infra/main.bicep outputs (azd provision stores it)' }
if (-not $env:AGENT_DATABASE_USER) { Fail "AGENT_DATABASE_USER is not set: expected the app's database user name infra/main.bicep outputs (azd provision stores it)" }
$apply = @()
if ($env:AGENT_SQL_SERVER) {
    if (-not $env:AGENT_SQL_DATABASE) { Fail 'AGENT_SQL_DATABASE is not set: expected the control database name infra/main.bicep outputs' }
    $apply = @('--apply')
} elseif ($env:AGENT_DB) {
    Write-Host 'postprovision: control database from AGENT_DB (a stand-in): grant-sql prints the T-SQL, it does not apply it'
} else {
    Fail 'AGENT_SQL_SERVER is not set: expected the SQL server FQDN infra/main.bicep outputs (or AGENT_DB, a stand-in control database)'
}
if (-not (Test-Path $python)) { Fail "${python}: no such interpreter. Create the project's virtual environment first (py -3.11 -m venv .venv; .venv\Scripts\pip install -r requirements.txt), or set AGENT_PYTHON" }
if (-not (Get-Command az -ErrorAction SilentlyContinue)) { Fail 'the Azure CLI (az) is not on PATH: install it and run az login' }

$networkProfile = if ($env:AGENT_NETWORK_PROFILE) { $env:AGENT_NETWORK_PROFILE } else { 'public' }
if ($networkProfile -eq 'private') {
    Write-Host 'postprovision: networkProfile private: no firewall rule (public network access is off); reaching the SQL server through its private endpoint, so this machine must be in the network'
    Write-Host 'postprovision: init-db'
    & $python -m shared.cli init-db
    if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
    Write-Host "postprovision: grant-sql --app-name $env:AGENT_DATABASE_USER $apply"
    & $python -m shared.cli grant-sql --app-name $env:AGENT_DATABASE_USER @apply
    exit $LASTEXITCODE
}
if ($networkProfile -ne 'public') { Fail "AGENT_NETWORK_PROFILE=${networkProfile}: expected public or private (the template's networkProfile)" }

$ip = $env:AGENT_DEPLOYER_IP
if (-not $ip) {
    try { $ip = "$(Invoke-RestMethod -Uri 'https://api.ipify.org' -TimeoutSec 15)".Trim() }
    catch { Fail "could not learn this machine's public IP address from https://api.ipify.org: set AGENT_DEPLOYER_IP" }
}
if ($ip -notmatch '^(\d{1,3}\.){3}\d{1,3}$') { Fail "AGENT_DEPLOYER_IP=${ip}: expected an IPv4 address such as 203.0.113.7 (Azure SQL firewall rules are IPv4)" }

$status = 0
try {
    Write-Host "postprovision: opening the SQL firewall of $env:AZURE_SQL_SERVER_NAME to $ip (rule $rule)"
    az sql server firewall-rule create --resource-group $env:AZURE_RESOURCE_GROUP `
        --server $env:AZURE_SQL_SERVER_NAME --name $rule `
        --start-ip-address $ip --end-ip-address $ip --only-show-errors | Out-Null
    if ($LASTEXITCODE -ne 0) { $status = $LASTEXITCODE; throw 'az sql server firewall-rule create failed' }

    Write-Host 'postprovision: init-db'
    & $python -m shared.cli init-db
    if ($LASTEXITCODE -ne 0) { $status = $LASTEXITCODE; throw "init-db failed (exit $LASTEXITCODE)" }

    Write-Host "postprovision: grant-sql --app-name $env:AGENT_DATABASE_USER $apply"
    & $python -m shared.cli grant-sql --app-name $env:AGENT_DATABASE_USER @apply
    if ($LASTEXITCODE -ne 0) { $status = $LASTEXITCODE; throw "grant-sql failed (exit $LASTEXITCODE)" }
}
catch {
    [Console]::Error.WriteLine("postprovision: $_")
    if ($status -eq 0) { $status = 1 }
}
finally {
    Write-Host "postprovision: closing the SQL firewall (rule $rule of $env:AZURE_SQL_SERVER_NAME)"
    az sql server firewall-rule delete --resource-group $env:AZURE_RESOURCE_GROUP `
        --server $env:AZURE_SQL_SERVER_NAME --name $rule --only-show-errors
    if ($LASTEXITCODE -ne 0) {
        [Console]::Error.WriteLine("postprovision: could not delete the firewall rule; delete it yourself: az sql server firewall-rule delete --resource-group $env:AZURE_RESOURCE_GROUP --server $env:AZURE_SQL_SERVER_NAME --name $rule")
        if ($status -eq 0) { $status = 1 }
    }
}
exit $status
