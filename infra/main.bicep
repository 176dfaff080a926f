// SQL Agent for Azure SQL, as Azure Functions: everything it runs on, in one resource group.
//
//   monitoring.bicep   Log Analytics workspace + workspace-based Application Insights
//   storage.bicep      storage account (Entra ID only), task queue + poison queue, deployment container
//   sql.bicep          Azure SQL logical server (Entra-only auth) + the control database (sqlTier)
//   functionapp.bicep  Flex Consumption plan + function app, app settings, the app's role assignments
//   network.bicep      networkProfile private: VNet integration, private endpoints, private DNS zones
//   alerts.bicep       optional: dead-man's switch and poison alerts on the engine's custom events
//   notifications.bicep optional: operators e-mailed of job outcomes per each job's notify (action group + log alerts)
//
// Deploy with the Azure Developer CLI:  azd up   (azure.yaml; parameters from infra/main.parameters.json,
// filled from the azd environment; the postprovision hook creates the schema and the app's user).
// Or by hand:  az deployment group create -g <rg> -f infra/main.bicep -p @infra/manual.parameters.json
// then create the app's database user (docs/deploying.md) and publish the code with
// `func azure functionapp publish <functionAppName> --python`.

@description('Azure region of every resource (one that offers the Flex Consumption plan).')
param location string = resourceGroup().location

@description('Short prefix of every resource name: 3-12 lowercase letters, digits or hyphens.')
@minLength(3)
@maxLength(12)
param namePrefix string = 'sqlagent'

@description('Function app name; empty derives a globally unique one from namePrefix. With the system-assigned identity it is also the database user name of the app.')
param functionAppName string = ''

@description('Tags applied to every resource.')
param tags object = {}

@description('azd environment name (AZURE_ENV_NAME), tagged azd-env-name on every resource; empty (deployments by hand): no tag.')
@maxLength(64)
param environmentName string = ''

@description('Identity of the function app: SystemAssigned (its own; the database user is named like the app) or UserAssigned (a separate identity that exists before the code is published and outlives the app; the database user is named like the identity).')
@allowed([
  'SystemAssigned'
  'UserAssigned'
])
param identityType string = 'SystemAssigned'

@description('Name of the user-assigned identity (identityType UserAssigned); empty derives <prefix>-id-<hash>.')
param userAssignedIdentityName string = ''

@description('Display name of the Entra ID administrator of the SQL server (user, group or service principal).')
param sqlAdminLogin string

@description('Object id of the Entra ID administrator of the SQL server.')
param sqlAdminObjectId string

@description('Kind of principal the SQL administrator is; ServicePrincipal (what azd reports for a service principal login, AZURE_PRINCIPAL_TYPE) is taken as Application.')
@allowed([
  'User'
  'Group'
  'Application'
  'ServicePrincipal'
])
param sqlAdminPrincipalType string = 'Group'

@description('Control database name (AGENT_SQL_DATABASE).')
param databaseName string = 'sqlagent'

// The control database's tier (sqlTier). Serverless (GP_S_Gen5) bills per vCore-second while the
// database is online, at least its minimum vCores; S0 to S3 are provisioned DTU tiers at a flat
// monthly price with 250 GB included; ServerlessFree is serverless with the Azure SQL Database free
// offer (useFreeLimit: 100,000 vCore-seconds, 32 GB of data and 32 GB of backups free each month,
// up to 10 such databases per subscription). docs/deploying.md ("The database tier") explains the
// default from the list prices.
@description('Tier of the control database: S0 (the default: provisioned, 10 DTUs, a flat price), S1, S2 or S3 (20, 50, 100 DTUs), Serverless (General Purpose serverless, GP_S_Gen5, billed per vCore-second while online) or ServerlessFree (the same with the free offer; only for a new database: an existing one cannot be converted).')
@allowed([
  'S0'
  'S1'
  'S2'
  'S3'
  'Serverless'
  'ServerlessFree'
])
param sqlTier string = 'S0'

@description('sqlTier ServerlessFree only: when the month\'s free amount is used up, BillOverUsage (the default) keeps the database online and bills the rest at serverless rates; AutoPause pauses it until the next month, and the agent runs no job until then.')
@allowed([
  'BillOverUsage'
  'AutoPause'
])
param sqlFreeLimitExhaustionBehavior string = 'BillOverUsage'

@description('Most vCores the serverless database scales up to (sqlTier Serverless, ServerlessFree).')
@allowed([
  1
  2
  4
  6
  8
  10
  12
  14
  16
])
param sqlMaxVCores int = 1

@description('Fewest vCores while the serverless database is online, as a decimal string (sqlTier Serverless, ServerlessFree).')
@allowed([
  '0.5'
  '0.75'
  '1'
  '1.25'
  '1.5'
  '1.75'
  '2'
])
param sqlMinVCores string = '0.5'

@description('Minutes without activity before the serverless database pauses (sqlTier Serverless, ServerlessFree); -1 never pauses, otherwise at least 15. The engine ticks every minute by default, which keeps the database online: pausing saves money only with quiet ticks (quietMaxMinutes) or a sparse AGENT_TICK_SCHEDULE; docs/cost.md.')
@minValue(-1)
@maxValue(10080)
param sqlAutoPauseDelayMinutes int = 60

@description('Largest size of the serverless control database, in GB (sqlTier Serverless, ServerlessFree; at most 32 with the free offer\'s AutoPause). The S tiers get the 250 GB their price includes.')
@minValue(1)
@maxValue(1024)
param sqlMaxSizeGB int = 32

@description('Where database backups are stored.')
@allowed([
  'Local'
  'Zone'
  'Geo'
])
param sqlBackupStorageRedundancy string = 'Local'

@description('Replication of the storage account (queues and the app package).')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param storageSkuName string = 'Standard_LRS'

@description('Task queue name (AGENT_QUEUE_NAME); the poison queue is <queueName>-poison.')
@minLength(3)
@maxLength(56)
param queueName string = 'agent-tasks'

@description('Six-field NCRONTAB of the engine tick (AGENT_TICK_SCHEDULE): seconds first, UTC.')
param tickSchedule string = '0 */1 * * * *'

@description('AGENT_QUIET_MAX_MINUTES: quiet ticks, the timer does not connect to the control database while nothing can come due, for at most this many minutes (work submitted from T-SQL waits up to that long); 0: off, the default (docs/cost.md says when it pays).')
@minValue(0)
@maxValue(1440)
param quietMaxMinutes int = 0

// The host moves a message to <queueName>-poison after host.json extensions.queues.maxDequeueCount
// failed deliveries (5), so the engine's threshold may not exceed it: @maxValue is that number,
// and tests/repo/test_infra.py fails when the two differ. To allow more deliveries, raise host.json's
// maxDequeueCount first, then this cap (here and in functionapp.bicep).
@description('Deliveries after which the engine poisons a message (AGENT_MAX_DEQUEUE_COUNT): 1 to host.json maxDequeueCount (5).')
@minValue(1)
@maxValue(5)
param maxDequeueCount int = 5

@description('Jobs, turned into JOB__<name>__<SETTING> app settings: [{ name, schedule? (none: an on-demand job), command?, timezone?, enabled?, maxAttempts?, timeoutSeconds?, leaseSeconds?, misfire?, graceSeconds?, overlap?, database?, notify?, notifyWebhookUrl?, targets?, targetParallelism?, targetStaggerSeconds?, after?, afterOutcome?, exclude?, only?, onExcluded?, jitterSeconds?, catchupSeconds?, maxDurationSeconds?, stopAfterSeconds?, slowerThan?, deadlineSeconds? }] (a command, or steps in jobSteps; exclude, only: names of calendars; targets: fleet members, docs/fleet.md; after: the job whose runs start this one, docs/configuration.md). Names: letters, digits and underscores (app setting names allow no hyphens).')
param jobs array = []

@description('Steps of multi-step jobs, one entry per step: [{ job, step, command, database?, maxAttempts?, retryIntervalSeconds?, timeoutSeconds?, onSuccess?, onFailure?, targets?, targetParallelism?, targetStaggerSeconds? }] (JOB__<job>__STEPS__<step>__<SETTING>); onSuccess / onFailure: next, quit_success, quit_failure or goto:<n>.')
param jobSteps array = []

@description('Calendars (holidays, freezes, maintenance windows) the jobs name in exclude / only, turned into CALENDAR__<name>__<SETTING> app settings: [{ name, dates? (\'2026-12-25, 2026-12-24..2026-12-26\'), weekly? (\'SAT-SUN, FRI 22:00-06:00\'), ics? (an iCalendar file in the app package) }] (docs/configuration.md).')
param calendars array = []

@description('Condition alerts, as SQL Server Agent\'s sp_add_alert, turned into ALERT__<name>__<SETTING> app settings: [{ name, query? (a probe whose rows are the alert; with schedule), schedule?, timezone?, errors? (error numbers, sqlstate=, severity>=N: \'50000,1205,severity>=16\'), delayBetweenResponsesSeconds?, notify?, notifyWebhookUrl?, responseJob?, timeoutSeconds?, enabled? }] (docs/monitoring.md#condition-alerts). Names: letters, digits and underscores.')
param alerts array = []

@description('Webhook the engine POSTs run outcomes to, per each job\'s notify (AGENT_NOTIFY_WEBHOOK_URL): https://; empty: none.')
@secure()
param notifyWebhookUrl string = ''

@description('Standard Webhooks signing secret of the notifications (AGENT_NOTIFY_WEBHOOK_SECRET): whsec_ and the base64 of 24 to 64 random bytes, or a Key Vault reference @Microsoft.KeyVault(SecretUri=...); empty: unsigned.')
@secure()
param notifyWebhookSecret string = ''

@description('E-mail addresses the job notification alerts (failed runs; successful runs of jobs whose notify asks for them) are sent to; empty: an action group with no receivers.')
param notifyEmails array = []

// Flex Consumption runs Python 3.10 to 3.13 (Get-AzFunctionAppFlexConsumptionRuntime lists them); the
// default is the newest. requirements.txt installs azure-functions 1.26 below 3.13 and 2.x (with the
// pinned azure-functions-runtime) on 3.13; pyproject.toml and scripts/python-env.sh accept the same
// versions (tests/repo/test_python_versions.py).
@description('Python version the function app runs on (Flex Consumption): 3.10 to 3.13.')
@allowed([
  '3.10'
  '3.11'
  '3.12'
  '3.13'
])
param pythonVersion string = '3.13'

@description('Most instances the function app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Memory of each function app instance, in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Days the Log Analytics workspace keeps telemetry and logs, the SQL audit log included.')
@minValue(30)
@maxValue(730)
param logRetentionInDays int = 90

@description('Create the alert rules of alerts.bicep (dead-man\'s switch and poison).')
param enableAlerts bool = false

@description('Jobs watched by the dead-man\'s switch: each must have a RunSucceeded event every alertMaxHoursWithoutSuccess hours.')
param alertJobs array = []

@description('Hours a watched job may go without a successful run before the dead-man\'s switch fires.')
@minValue(1)
@maxValue(48)
param alertMaxHoursWithoutSuccess int = 26

@description('Existing action groups the alerts notify (resource ids).')
param alertActionGroupIds array = []

@description('E-mail address the alerts notify through a new action group; empty creates none.')
param alertEmail string = ''

@description('Severity of the alerts: 0 critical to 4 verbose.')
@minValue(0)
@maxValue(4)
param alertSeverity int = 2

@description('public (the default): the SQL server and the storage account keep public endpoints (Entra ID only, the SQL firewall admits Azure services). private: the app joins a virtual network, the SQL server and the storage account are reached through private endpoints, and their public network access is off (docs/deploying.md, "Private networking").')
@allowed([
  'public'
  'private'
])
param networkProfile string = 'public'

@description('networkProfile private: resource id of an existing virtual network in this region, whose subnets appSubnetName (delegated to Microsoft.App/environments, /27 or larger) and privateEndpointSubnetName exist; empty: the template creates the network.')
param vnetId string = ''

@description('networkProfile private, network created here: its address space.')
param vnetAddressPrefix string = '10.90.0.0/16'

@description('networkProfile private: the subnet the function app integrates with (created here, or existing in vnetId).')
param appSubnetName string = 'sqlagent-app'

@description('networkProfile private, network created here: the app subnet\'s address range.')
param appSubnetPrefix string = '10.90.0.0/24'

@description('networkProfile private: the subnet of the private endpoints (created here, or existing in vnetId).')
param privateEndpointSubnetName string = 'sqlagent-endpoints'

@description('networkProfile private, network created here: the private endpoint subnet\'s address range.')
param privateEndpointSubnetPrefix string = '10.90.1.0/24'

@description('networkProfile private: create the privatelink DNS zones (SQL, blob, queue, table) and link them to the network; false when your DNS (e.g. a hub\'s central zones) resolves the endpoints.')
param createPrivateDnsZones bool = true

// Resource names: the lowercase prefix, the kind of resource and 8 characters of a hash of the
// resource group and prefix (globally unique names: function app, storage account, SQL server).
var prefix = toLower(namePrefix)
var suffix = uniqueString(resourceGroup().id, prefix)
var shortSuffix = take(suffix, 8)
var appName = empty(functionAppName) ? '${prefix}-func-${shortSuffix}' : functionAppName
var storageAccountName = take('st${replace(prefix, '-', '')}${suffix}', 24)
var deploymentContainerName = 'app-package'
var identityName = empty(userAssignedIdentityName) ? '${prefix}-id-${shortSuffix}' : userAssignedIdentityName
var isPrivate = networkProfile == 'private'
var allTags = empty(environmentName) ? tags : union(tags, {
  'azd-env-name': environmentName
})

@description('Job Activity Monitor: application (client) id of the Entra app registration people sign in with (docs/monitor.md); empty keeps the monitor closed (401).')
param monitorEntraClientId string = ''

@description('Job Activity Monitor: object id of the Entra group whose members may open it; empty keeps it closed.')
param monitorAllowedGroupObjectId string = ''

@description('Job Activity Monitor: name of an app setting holding the app registration\'s client secret, set after deploying; empty signs in with ID tokens alone.')
param monitorClientSecretSettingName string = ''

module monitoring 'monitoring.bicep' = {
  name: 'monitoring'
  params: {
    location: location
    tags: allTags
    workspaceName: '${prefix}-logs-${shortSuffix}'
    appInsightsName: '${prefix}-appi-${shortSuffix}'
    retentionInDays: logRetentionInDays
  }
}

module storage 'storage.bicep' = {
  name: 'storage'
  params: {
    location: location
    tags: allTags
    storageAccountName: storageAccountName
    skuName: storageSkuName
    queueName: queueName
    deploymentContainerName: deploymentContainerName
    workspaceId: monitoring.outputs.workspaceId
    networkProfile: networkProfile
  }
}

module sql 'sql.bicep' = {
  name: 'sql'
  params: {
    location: location
    tags: allTags
    sqlServerName: '${prefix}-sql-${shortSuffix}'
    databaseName: databaseName
    adminLogin: sqlAdminLogin
    adminObjectId: sqlAdminObjectId
    adminPrincipalType: (sqlAdminPrincipalType == 'ServicePrincipal') ? 'Application' : sqlAdminPrincipalType
    tier: sqlTier
    freeLimitExhaustionBehavior: sqlFreeLimitExhaustionBehavior
    maxVCores: sqlMaxVCores
    minVCores: sqlMinVCores
    autoPauseDelayMinutes: sqlAutoPauseDelayMinutes
    maxSizeGB: sqlMaxSizeGB
    backupStorageRedundancy: sqlBackupStorageRedundancy
    workspaceId: monitoring.outputs.workspaceId
    networkProfile: networkProfile
  }
}

// networkProfile private: the network, the private endpoints of the SQL server and the storage
// account, and their DNS zones.
module network 'network.bicep' = if (isPrivate) {
  name: 'network'
  params: {
    location: location
    tags: allTags
    namePrefix: prefix
    vnetName: '${prefix}-vnet-${shortSuffix}'
    vnetId: vnetId
    vnetAddressPrefix: vnetAddressPrefix
    appSubnetName: appSubnetName
    appSubnetPrefix: appSubnetPrefix
    privateEndpointSubnetName: privateEndpointSubnetName
    privateEndpointSubnetPrefix: privateEndpointSubnetPrefix
    createPrivateDnsZones: createPrivateDnsZones
    sqlServerId: sql.outputs.sqlServerId
    storageAccountId: storage.outputs.storageAccountId
  }
}

module functionApp 'functionapp.bicep' = {
  name: 'functionapp'
  params: {
    location: location
    tags: allTags
    functionAppName: appName
    identityType: identityType
    userAssignedIdentityName: identityName
    planName: '${prefix}-plan-${shortSuffix}'
    pythonVersion: pythonVersion
    // ARM evaluates only the branch taken: with the public profile the network module's output is never read.
    appSubnetId: isPrivate ? network.outputs.appSubnetId : ''
    storageAccountName: storage.outputs.storageAccountName
    deploymentContainerName: storage.outputs.deploymentContainerName
    queueName: storage.outputs.queueName
    appInsightsName: monitoring.outputs.appInsightsName
    sqlServerFqdn: sql.outputs.sqlServerFqdn
    sqlDatabaseName: sql.outputs.databaseName
    tickSchedule: tickSchedule
    quietMaxMinutes: quietMaxMinutes
    maxDequeueCount: maxDequeueCount
    jobs: jobs
    jobSteps: jobSteps
    calendars: calendars
    alerts: alerts
    notifyWebhookUrl: notifyWebhookUrl
    notifyWebhookSecret: notifyWebhookSecret
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    monitorEntraClientId: monitorEntraClientId
    monitorAllowedGroupObjectId: monitorAllowedGroupObjectId
    monitorClientSecretSettingName: monitorClientSecretSettingName
  }
}

module alerts 'alerts.bicep' = if (enableAlerts) {
  name: 'alerts'
  params: {
    location: location
    tags: allTags
    namePrefix: prefix
    appInsightsName: monitoring.outputs.appInsightsName
    deadMansSwitchJobs: alertJobs
    maxHoursWithoutSuccess: alertMaxHoursWithoutSuccess
    actionGroupIds: alertActionGroupIds
    alertEmail: alertEmail
    severity: alertSeverity
  }
}

// Operators notified by e-mail through Azure Monitor, per each job's notify: no code in the app.
module jobNotifications 'notifications.bicep' = if (enableAlerts) {
  name: 'notifications'
  params: {
    location: location
    tags: allTags
    namePrefix: prefix
    appInsightsName: monitoring.outputs.appInsightsName
    jobs: jobs
    emails: notifyEmails
    actionGroupIds: alertActionGroupIds
    severity: alertSeverity
  }
}

output functionAppName string = functionApp.outputs.functionAppName
output functionAppPrincipalId string = functionApp.outputs.principalId
@description('The Job Activity Monitor (Entra sign-in, members of monitorAllowedGroupObjectId only).')
output monitorUrl string = functionApp.outputs.monitorUrl
output sqlServerFqdn string = sql.outputs.sqlServerFqdn
@description('public or private: how the operator CLI reaches the SQL server (private: from inside the network; docs/deploying.md).')
output AGENT_NETWORK_PROFILE string = networkProfile
output sqlDatabaseName string = sql.outputs.databaseName
output storageAccountName string = storage.outputs.storageAccountName
output queueName string = storage.outputs.queueName
output poisonQueueName string = storage.outputs.poisonQueueName
output appInsightsName string = monitoring.outputs.appInsightsName
@description('App setting that carries the Application Insights connection string.')
output appInsightsConnectionStringSettingName string = 'APPLICATIONINSIGHTS_CONNECTION_STRING'
@description('The app\'s database user: the function app\'s name, or the user-assigned identity\'s (grant-sql --app-name).')
output databaseUserName string = functionApp.outputs.databaseUserName
@description('Prints the T-SQL that makes the app a database user (run it as the Entra ID administrator).')
output grantSqlCommand string = '.venv/bin/python -m shared.cli grant-sql --app-name ${functionApp.outputs.databaseUserName}'

// For the Azure Developer CLI: azd stores every output in the environment (.azure/<env>/.env),
// where the postprovision hook (scripts/azd/) and `azd env get-values` read them. AGENT_SQL_SERVER
// and AGENT_SQL_DATABASE are the engine's own setting names, so the CLI run by the hook reaches
// the new database without further configuration.
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.functionAppName
output SERVICE_AGENT_NAME string = functionApp.outputs.functionAppName
output AZURE_SQL_SERVER_NAME string = sql.outputs.sqlServerName
output AGENT_SQL_SERVER string = sql.outputs.sqlServerFqdn
output AGENT_SQL_DATABASE string = sql.outputs.databaseName
output AGENT_DATABASE_USER string = functionApp.outputs.databaseUserName
output AGENT_IDENTITY_CLIENT_ID string = functionApp.outputs.identityClientId
