#!/bin/sh
# azd postprovision hook (azure.yaml; on Windows azd runs postprovision.ps1, the same steps).
#
# After `azd provision` / `azd up` created the resources, and before azd publishes the code, make
# the new control database ready:
#   1. open the SQL server's firewall for this machine (rule azd-postprovision),
#   2. init-db: create or upgrade the control schema, as you, the SQL server's Entra ID admin
#      (infra/main.parameters.json makes the deployer, AZURE_PRINCIPAL_ID, that admin),
#   3. grant-sql --apply: the app's database user (its managed identity's name, the template's
#      output AGENT_DATABASE_USER) with least privilege,
#   4. close the firewall again: always, also when a step fails or the hook is interrupted.
#
# azd runs it from the project root with the azd environment in its environment: the template's
# outputs (AZURE_SQL_SERVER_NAME, AGENT_SQL_SERVER, AGENT_SQL_DATABASE, AGENT_DATABASE_USER) and
# AZURE_RESOURCE_GROUP. The operator CLI runs as `python -m shared.cli` with the project's virtual
# environment (.venv/bin/python; AGENT_PYTHON names another interpreter with requirements.txt
# installed). It signs in to Azure SQL with your Azure CLI login (`az login`), as `az` does here.
#
# With the template's networkProfile private (output AGENT_NETWORK_PROFILE) the server's public
# network access is off and it takes no firewall rule: steps 1 and 4 are skipped, and init-db and
# grant-sql reach the server through its private endpoint, so this machine must be inside the
# network (docs/deploying.md, "Private networking").
#
# Optional: AGENT_DEPLOYER_IP, the IPv4 address to admit (default: what https://api.ipify.org
# sees); AGENT_FIREWALL_RULE, the rule's name. AGENT_DB instead of AGENT_SQL_SERVER: a stand-in
# control database (PostgreSQL or SQLite; a rehearsal, or tests/repo/test_azd.py): init-db runs on it
# and grant-sql prints its T-SQL, because --apply is for Azure SQL and SQL Server only.
set -eu

cd "$(dirname "$0")/../.."

fail() {
    echo "postprovision: $*" >&2
    exit 1
}

PYTHON=${AGENT_PYTHON:-.venv/bin/python}
RULE=${AGENT_FIREWALL_RULE:-azd-postprovision}

[ -n "${AZURE_RESOURCE_GROUP:-}" ] || fail "AZURE_RESOURCE_GROUP is not set: expected the resource group azd deployed to (run this through azd provision or azd up)"
[ -n "${AZURE_SQL_SERVER_NAME:-}" ] || fail "AZURE_SQL_SERVER_NAME is not set: expected the SQL server name infra/main.bicep outputs (azd provision stores it)"
[ -n "${AGENT_DATABASE_USER:-}" ] || fail "AGENT_DATABASE_USER is not set: expected the app's database user name infra/main.bicep outputs (azd provision stores it)"
if [ -n "${AGENT_SQL_SERVER:-}" ]; then
    [ -n "${AGENT_SQL_DATABASE:-}" ] || fail "AGENT_SQL_DATABASE is not set: expected the control database name infra/main.bicep outputs"
    APPLY=--apply
elif [ -n "${AGENT_DB:-}" ]; then
    APPLY=
    echo "postprovision: control database from AGENT_DB (a stand-in): grant-sql prints the T-SQL, it does not apply it"
else
    fail "AGENT_SQL_SERVER is not set: expected the SQL server FQDN infra/main.bicep outputs (or AGENT_DB, a stand-in control database)"
fi
[ -x "$PYTHON" ] || fail "$PYTHON: no such interpreter. Create the project's virtual environment first (scripts/run-local.sh, or: python3.11 -m venv .venv && .venv/bin/pip install -r requirements.txt), or set AGENT_PYTHON"
command -v az >/dev/null 2>&1 || fail "the Azure CLI (az) is not on PATH: install it and run az login"

case "${AGENT_NETWORK_PROFILE:-public}" in
    public) ;;
    private)
        echo "postprovision: networkProfile private: no firewall rule (public network access is off); reaching the SQL server through its private endpoint, so this machine must be in the network"
        echo "postprovision: init-db"
        "$PYTHON" -m shared.cli init-db
        echo "postprovision: grant-sql --app-name $AGENT_DATABASE_USER $APPLY"
        # shellcheck disable=SC2086  # APPLY is one word or none
        "$PYTHON" -m shared.cli grant-sql --app-name "$AGENT_DATABASE_USER" $APPLY
        exit 0 ;;
    *) fail "AGENT_NETWORK_PROFILE=$AGENT_NETWORK_PROFILE: expected public or private (the template's networkProfile)" ;;
esac

IP=${AGENT_DEPLOYER_IP:-}
if [ -z "$IP" ]; then
    IP=$(curl -fsS --max-time 15 https://api.ipify.org) || fail "could not learn this machine's public IP address from https://api.ipify.org: set AGENT_DEPLOYER_IP"
fi
echo "$IP" | grep -Eq '^([0-9]{1,3}\.){3}[0-9]{1,3}$' || fail "AGENT_DEPLOYER_IP=$IP: expected an IPv4 address such as 203.0.113.7 (Azure SQL firewall rules are IPv4)"

close_firewall() {
    status=$?
    trap - EXIT HUP INT TERM
    echo "postprovision: closing the SQL firewall (rule $RULE of $AZURE_SQL_SERVER_NAME)"
    if ! az sql server firewall-rule delete --resource-group "$AZURE_RESOURCE_GROUP" \
            --server "$AZURE_SQL_SERVER_NAME" --name "$RULE" --only-show-errors; then
        echo "postprovision: could not delete the firewall rule; delete it yourself: az sql server firewall-rule delete --resource-group $AZURE_RESOURCE_GROUP --server $AZURE_SQL_SERVER_NAME --name $RULE" >&2
        [ "$status" -ne 0 ] || status=1
    fi
    exit "$status"
}
# From here on the rule is removed whatever happens (set before the create: a create that fails
# half-way leaves nothing behind either).
trap close_firewall EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

echo "postprovision: opening the SQL firewall of $AZURE_SQL_SERVER_NAME to $IP (rule $RULE)"
az sql server firewall-rule create --resource-group "$AZURE_RESOURCE_GROUP" \
    --server "$AZURE_SQL_SERVER_NAME" --name "$RULE" \
    --start-ip-address "$IP" --end-ip-address "$IP" --only-show-errors >/dev/null

echo "postprovision: init-db"
"$PYTHON" -m shared.cli init-db

echo "postprovision: grant-sql --app-name $AGENT_DATABASE_USER $APPLY"
# shellcheck disable=SC2086  # APPLY is one word or none
"$PYTHON" -m shared.cli grant-sql --app-name "$AGENT_DATABASE_USER" $APPLY
