// The function app: Flex Consumption plan, Python (pythonVersion, 3.13 by default), a managed
// identity (the app's own system-assigned one, or a user-assigned one this file creates:
// identityType), identity-based storage, and every app setting the engine reads
// (shared/settings.py). Job schedules are app
// settings (JOB__<name>__<SETTING>) built from the `jobs` parameter, so a schedule can change
// later with `az functionapp config appsettings set` and no code deploy.
//
// The identity's role assignments are at the end of this file, next to an `existing` reference
// to the storage account they grant: what identity-based AzureWebJobsStorage needs for this app
// (host storage, the queue trigger, dispatch, the host's poison queue, diagnostic events), and
// nothing more. docs/deploying.md and `doctor` name the same three roles.

@description('Azure region of the resources.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Function app name: globally unique, becomes <name>.azurewebsites.net; with the system-assigned identity also the database user name.')
param functionAppName string

// The identity the app runs as. SystemAssigned: the app's own, named like the app, created with
// it and deleted with it. UserAssigned: a separate identity (Microsoft's Flex Consumption
// quickstarts use one) that exists as soon as it is provisioned and outlives the app, so its
// database user can be created before the first publish and survives a re-created app; the app
// then names it in AzureWebJobsStorage__clientId, AGENT_SQL_CLIENT_ID and the ClientId of
// APPLICATIONINSIGHTS_AUTHENTICATION_STRING.
@description('Identity of the app: SystemAssigned (its own; the database user is named like the app) or UserAssigned (userAssignedIdentityName, created here; the database user is named like the identity).')
@allowed([
  'SystemAssigned'
  'UserAssigned'
])
param identityType string = 'SystemAssigned'

@description('Name of the user-assigned identity created when identityType is UserAssigned (ignored otherwise); it is the database user name of the app then.')
param userAssignedIdentityName string

@description('Flex Consumption plan name.')
param planName string

@description('Resource id of the subnet the app integrates with (networkProfile private: network.bicep); empty: no VNet integration.')
param appSubnetId string = ''

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

@description('Storage account the host and the engine use (created by storage.bicep).')
param storageAccountName string

@description('Blob container the app package is deployed to (created by storage.bicep).')
param deploymentContainerName string

@description('Queue the timer dispatches to and the queue trigger reads (created by storage.bicep).')
param queueName string

@description('Application Insights component (created by monitoring.bicep).')
param appInsightsName string

@description('Fully qualified name of the Azure SQL logical server.')
param sqlServerFqdn string

@description('Control database name.')
param sqlDatabaseName string

@description('Six-field NCRONTAB of the engine tick (seconds first, UTC).')
param tickSchedule string

@description('AGENT_QUIET_MAX_MINUTES (0: quiet ticks off).')
@minValue(0)
@maxValue(1440)
param quietMaxMinutes int = 0

// At most host.json extensions.queues.maxDequeueCount (5): the host's own move to <queue>-poison
// must not come before the engine's threshold. tests/repo/test_infra.py keeps the two equal.
@description('Deliveries after which the engine poisons a message (AGENT_MAX_DEQUEUE_COUNT): 1 to host.json maxDequeueCount (5).')
@minValue(1)
@maxValue(5)
param maxDequeueCount int

@description('Jobs: [{ name, schedule? (none: on demand), command?, timezone?, enabled?, maxAttempts?, timeoutSeconds?, leaseSeconds?, misfire?, graceSeconds?, overlap?, database?, notify?, notifyWebhookUrl?, targets?, targetParallelism?, targetStaggerSeconds?, after?, afterOutcome?, exclude?, only?, onExcluded?, jitterSeconds?, catchupSeconds?, maxDurationSeconds?, stopAfterSeconds?, slowerThan?, deadlineSeconds? }] (command, or steps in jobSteps; after: the job whose runs start this one; exclude, only: calendar names).')
param jobs array

@description('Calendars the jobs name in exclude / only, turned into CALENDAR__<name>__<SETTING> app settings: [{ name, dates?, weekly?, ics? }] (docs/configuration.md).')
param calendars array = []

@description('Condition alerts, turned into ALERT__<name>__<SETTING> app settings: [{ name, query? (a probe whose rows are the alert, with schedule), schedule?, timezone?, errors? (\'50000,1205,severity>=16\'), delayBetweenResponsesSeconds?, notify?, notifyWebhookUrl?, responseJob?, timeoutSeconds?, enabled? }] (docs/monitoring.md#condition-alerts).')
param alerts array = []

@description('Steps of multi-step jobs, one entry per step: [{ job, step, command, database?, maxAttempts?, retryIntervalSeconds?, timeoutSeconds?, onSuccess?, onFailure?, targets?, targetParallelism?, targetStaggerSeconds? }].')
param jobSteps array

@description('Webhook the engine POSTs run outcomes to (AGENT_NOTIFY_WEBHOOK_URL); empty: none.')
@secure()
param notifyWebhookUrl string

@description('Standard Webhooks signing secret of the notifications (AGENT_NOTIFY_WEBHOOK_SECRET): whsec_ and base64, or a Key Vault reference; empty: unsigned.')
@secure()
param notifyWebhookSecret string = ''

@description('Most instances the app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int

@description('Memory of each instance, in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

// The Job Activity Monitor (docs/monitor.md): App Service Authentication signs people in with
// Entra ID through this app registration and admits only this group. Empty: nobody gets in.
@description('Application (client) id of the Entra app registration people sign in to the monitor with; empty keeps the app closed (every request gets 401).')
param monitorEntraClientId string

@description('Object id of the Entra group whose members may open the monitor (AGENT_MONITOR_ALLOWED_GROUP); empty keeps the app closed.')
param monitorAllowedGroupObjectId string

@description('Name of an app setting holding the app registration\'s client secret (set it yourself after deploying); empty signs in with ID tokens alone.')
param monitorClientSecretSettingName string

// Built-in role definition ids (the same in every tenant).
var storageBlobDataOwnerRoleId = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageQueueDataContributorRoleId = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var storageTableDataContributorRoleId = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var monitoringMetricsPublisherRoleId = '3913510d-42f4-4e42-8a64-420c390055eb'

var blobServiceUri = 'https://${storageAccountName}.blob.${environment().suffixes.storage}'
var queueServiceUri = 'https://${storageAccountName}.queue.${environment().suffixes.storage}'
var tableServiceUri = 'https://${storageAccountName}.table.${environment().suffixes.storage}'

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// ---------------------------------------------------------------- identity

var useUserAssignedIdentity = identityType == 'UserAssigned'

resource appIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = if (useUserAssignedIdentity) {
  name: userAssignedIdentityName
  location: location
  tags: tags
}

// Who the role assignments below grant, and the database user grant-sql creates: the
// user-assigned identity, or the app's own. (ARM evaluates only the chosen branch of a
// condition, so the branch not taken never reads an identity that does not exist.)
var appPrincipalId = useUserAssignedIdentity ? appIdentity.properties.principalId : functionApp.identity.principalId
var databaseUserName = useUserAssignedIdentity ? userAssignedIdentityName : functionAppName
// In the role assignments' names: one name per (scope, grantee, role), so switching identityType
// creates new assignments instead of trying to re-point an existing one (which ARM refuses).
var granteeId = useUserAssignedIdentity ? appIdentity.id : functionApp.id

// ---------------------------------------------------------------- app settings

// Settings the engine reads; names and meaning are in shared/settings.py ENGINE_SETTINGS.
// tests/repo/test_infra.py fails if this list and the engine's list drift apart.
var engineAppSettings = [
  {
    name: 'AGENT_SQL_SERVER'
    value: sqlServerFqdn
  }
  {
    name: 'AGENT_SQL_DATABASE'
    value: sqlDatabaseName
  }
  {
    name: 'AGENT_QUEUE_NAME'
    value: queueName
  }
  {
    name: 'AGENT_TICK_SCHEDULE'
    value: tickSchedule
  }
  {
    name: 'AGENT_QUIET_MAX_MINUTES'
    value: string(quietMaxMinutes)
  }
  {
    name: 'AGENT_MAX_DEQUEUE_COUNT'
    value: string(maxDequeueCount)
  }
  {
    name: 'AzureWebJobsStorage__queueServiceUri'
    value: queueServiceUri
  }
  {
    name: 'AzureWebJobsStorage__credential'
    value: 'managedidentity'
  }
  {
    name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
    value: appInsights.properties.ConnectionString
  }
  {
    // Ingestion with the app's Entra ID token (the Functions host and the engine's exporter
    // both read it): the component has local (key) authentication disabled.
    name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
    value: useUserAssignedIdentity ? 'Authorization=AAD;ClientId=${appIdentity.properties.clientId}' : 'Authorization=AAD'
  }
  {
    // The monitor checks the group again from the principal the platform passes, and refuses
    // everyone while this is empty.
    name: 'AGENT_MONITOR_ALLOWED_GROUP'
    value: monitorAllowedGroupObjectId
  }
  {
    // Empty reads as unset: no webhook.
    name: 'AGENT_NOTIFY_WEBHOOK_URL'
    value: notifyWebhookUrl
  }
  {
    // Empty reads as unset: notifications are not signed.
    name: 'AGENT_NOTIFY_WEBHOOK_SECRET'
    value: notifyWebhookSecret
  }
]

// Settings only the Functions host reads (on the allow-list in tests/repo/test_infra.py). With
// AzureWebJobsStorage__queueServiceUri and __credential above, they make the host's storage
// connection identity-based for all three services it uses.
var hostAppSettings = [
  {
    // Host storage over the identity: singleton locks, timer schedule status and keys are blobs.
    name: 'AzureWebJobsStorage__blobServiceUri'
    value: blobServiceUri
  }
  {
    // The host persists its diagnostic events in a table of this account.
    name: 'AzureWebJobsStorage__tableServiceUri'
    value: tableServiceUri
  }
]

// With the user-assigned identity, the engine's SQL token and the storage connection (host and
// engine) name it by client id; with the system-assigned one these settings are absent.
var userAssignedIdentitySettings = useUserAssignedIdentity ? [
  {
    name: 'AGENT_SQL_CLIENT_ID'
    value: appIdentity.properties.clientId
  }
  {
    name: 'AzureWebJobsStorage__clientId'
    value: appIdentity.properties.clientId
  }
] : []

// One list per field of a `jobs` entry; the setting suffix is the field name in UPPER_SNAKE.
// Every field but name is optional (no schedule: an on-demand job; command, or steps); a missing field
// gives a null value (safe dereference `.?`) and is dropped below. One loop per field rather
// than one per job: Bicep cannot nest for-expressions, and each loop allows 800 jobs.
var jobScheduleSettings = [for job in jobs: { name: 'JOB__${job.name}__SCHEDULE', value: job.?schedule }]
var jobCommandSettings = [for job in jobs: { name: 'JOB__${job.name}__COMMAND', value: job.?command }]
var jobTimezoneSettings = [for job in jobs: { name: 'JOB__${job.name}__TIMEZONE', value: job.?timezone }]
var jobEnabledSettings = [for job in jobs: { name: 'JOB__${job.name}__ENABLED', value: job.?enabled }]
var jobMaxAttemptsSettings = [for job in jobs: { name: 'JOB__${job.name}__MAX_ATTEMPTS', value: job.?maxAttempts }]
var jobTimeoutSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__TIMEOUT_SECONDS', value: job.?timeoutSeconds }]
var jobLeaseSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__LEASE_SECONDS', value: job.?leaseSeconds }]
var jobMisfireSettings = [for job in jobs: { name: 'JOB__${job.name}__MISFIRE', value: job.?misfire }]
var jobGraceSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__GRACE_SECONDS', value: job.?graceSeconds }]
var jobOverlapSettings = [for job in jobs: { name: 'JOB__${job.name}__OVERLAP', value: job.?overlap }]
var jobDatabaseSettings = [for job in jobs: { name: 'JOB__${job.name}__DATABASE', value: job.?database }]
var jobNotifySettings = [for job in jobs: { name: 'JOB__${job.name}__NOTIFY', value: job.?notify }]
var jobNotifyWebhookUrlSettings = [for job in jobs: { name: 'JOB__${job.name}__NOTIFY_WEBHOOK_URL', value: job.?notifyWebhookUrl }]
var jobTargetsSettings = [for job in jobs: { name: 'JOB__${job.name}__TARGETS', value: job.?targets }]
var jobTargetParallelismSettings = [for job in jobs: { name: 'JOB__${job.name}__TARGET_PARALLELISM', value: job.?targetParallelism }]
var jobTargetStaggerSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__TARGET_STAGGER_SECONDS', value: job.?targetStaggerSeconds }]
var jobAfterSettings = [for job in jobs: { name: 'JOB__${job.name}__AFTER', value: job.?after }]
var jobAfterOutcomeSettings = [for job in jobs: { name: 'JOB__${job.name}__AFTER_OUTCOME', value: job.?afterOutcome }]
var jobExcludeSettings = [for job in jobs: { name: 'JOB__${job.name}__EXCLUDE', value: job.?exclude }]
var jobOnlySettings = [for job in jobs: { name: 'JOB__${job.name}__ONLY', value: job.?only }]
var jobOnExcludedSettings = [for job in jobs: { name: 'JOB__${job.name}__ON_EXCLUDED', value: job.?onExcluded }]
var jobJitterSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__JITTER_SECONDS', value: job.?jitterSeconds }]
var jobCatchupSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__CATCHUP_SECONDS', value: job.?catchupSeconds }]
var jobMaxDurationSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__MAX_DURATION_SECONDS', value: job.?maxDurationSeconds }]
var jobStopAfterSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__STOP_AFTER_SECONDS', value: job.?stopAfterSeconds }]
var jobSlowerThanSettings = [for job in jobs: { name: 'JOB__${job.name}__SLOWER_THAN', value: job.?slowerThan }]
var jobDeadlineSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__DEADLINE_SECONDS', value: job.?deadlineSeconds }]
var calendarDatesSettings = [for c in calendars: { name: 'CALENDAR__${c.name}__DATES', value: c.?dates }]
var calendarWeeklySettings = [for c in calendars: { name: 'CALENDAR__${c.name}__WEEKLY', value: c.?weekly }]
var calendarIcsSettings = [for c in calendars: { name: 'CALENDAR__${c.name}__ICS', value: c.?ics }]
var alertQuerySettings = [for a in alerts: { name: 'ALERT__${a.name}__QUERY', value: a.?query }]
var alertScheduleSettings = [for a in alerts: { name: 'ALERT__${a.name}__SCHEDULE', value: a.?schedule }]
var alertTimezoneSettings = [for a in alerts: { name: 'ALERT__${a.name}__TIMEZONE', value: a.?timezone }]
var alertErrorsSettings = [for a in alerts: { name: 'ALERT__${a.name}__ERRORS', value: a.?errors }]
var alertDelayBetweenResponsesSecondsSettings = [for a in alerts: { name: 'ALERT__${a.name}__DELAY_BETWEEN_RESPONSES_SECONDS', value: a.?delayBetweenResponsesSeconds }]
var alertNotifySettings = [for a in alerts: { name: 'ALERT__${a.name}__NOTIFY', value: a.?notify }]
var alertNotifyWebhookUrlSettings = [for a in alerts: { name: 'ALERT__${a.name}__NOTIFY_WEBHOOK_URL', value: a.?notifyWebhookUrl }]
var alertResponseJobSettings = [for a in alerts: { name: 'ALERT__${a.name}__RESPONSE_JOB', value: a.?responseJob }]
var alertTimeoutSecondsSettings = [for a in alerts: { name: 'ALERT__${a.name}__TIMEOUT_SECONDS', value: a.?timeoutSeconds }]
var alertEnabledSettings = [for a in alerts: { name: 'ALERT__${a.name}__ENABLED', value: a.?enabled }]

// Steps of multi-step jobs (JOB__<job>__STEPS__<step>__<SETTING>): a flat list, one entry per
// step naming its job, because Bicep cannot nest for-expressions (and Checkov's Bicep parser
// reads no map() lambda). The engine checks the numbering and the flow at sync.
var jobStepCommandSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__COMMAND', value: s.command }]
var jobStepDatabaseSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__DATABASE', value: s.?database }]
var jobStepMaxAttemptsSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__MAX_ATTEMPTS', value: s.?maxAttempts }]
var jobStepRetryIntervalSecondsSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__RETRY_INTERVAL_SECONDS', value: s.?retryIntervalSeconds }]
var jobStepTimeoutSecondsSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__TIMEOUT_SECONDS', value: s.?timeoutSeconds }]
var jobStepOnSuccessSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__ON_SUCCESS', value: s.?onSuccess }]
var jobStepOnFailureSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__ON_FAILURE', value: s.?onFailure }]
var jobStepTargetsSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__TARGETS', value: s.?targets }]
var jobStepTargetParallelismSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__TARGET_PARALLELISM', value: s.?targetParallelism }]
var jobStepTargetStaggerSecondsSettings = [for s in jobSteps: { name: 'JOB__${s.job}__STEPS__${s.step}__TARGET_STAGGER_SECONDS', value: s.?targetStaggerSeconds }]

var jobSettingCandidates = concat(jobScheduleSettings, jobCommandSettings, jobTimezoneSettings, jobEnabledSettings, jobMaxAttemptsSettings, jobTimeoutSecondsSettings, jobLeaseSecondsSettings, jobMisfireSettings, jobGraceSecondsSettings, jobOverlapSettings, jobDatabaseSettings, jobNotifySettings, jobNotifyWebhookUrlSettings, jobTargetsSettings, jobTargetParallelismSettings, jobTargetStaggerSecondsSettings, jobAfterSettings, jobAfterOutcomeSettings, jobExcludeSettings, jobOnlySettings, jobOnExcludedSettings, jobJitterSecondsSettings, jobCatchupSecondsSettings, jobMaxDurationSecondsSettings, jobStopAfterSecondsSettings, jobSlowerThanSettings, jobDeadlineSecondsSettings, calendarDatesSettings, calendarWeeklySettings, calendarIcsSettings, alertQuerySettings, alertScheduleSettings, alertTimezoneSettings, alertErrorsSettings, alertDelayBetweenResponsesSecondsSettings, alertNotifySettings, alertNotifyWebhookUrlSettings, alertResponseJobSettings, alertTimeoutSecondsSettings, alertEnabledSettings, jobStepCommandSettings, jobStepDatabaseSettings, jobStepMaxAttemptsSettings, jobStepRetryIntervalSecondsSettings, jobStepTimeoutSecondsSettings, jobStepOnSuccessSettings, jobStepOnFailureSettings, jobStepTargetsSettings, jobStepTargetParallelismSettings, jobStepTargetStaggerSecondsSettings)
var presentJobSettings = filter(jobSettingCandidates, setting => setting.value != null)

// App settings are strings: booleans become 'true' / 'false' (string() would give 'True'),
// numbers their decimal text, strings stay as they are.
var jobAppSettings = [for setting in presentJobSettings: {
  name: setting.name
  value: setting.value == true ? 'true' : (setting.value == false ? 'false' : string(setting.value))
}]

// ---------------------------------------------------------------- plan and app

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225:Flex Consumption zone redundancy exists only in some regions; a run lost with a zone is dispatched again when its lease expires.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222:The one HTTP trigger is the read-only monitor, for people in a browser; every request to the app must sign in with Entra ID first (authsettingsV2 below), and the host endpoints need keys.
  // checkov:skip=CKV_AZURE_17:People open the monitor in a browser, signed in with Entra ID (authsettingsV2 below); client certificates would lock them out. The host admin endpoints are protected by keys.
  // checkov:skip=CKV_AZURE_212:Serverless by design: the timer and the queue trigger scale from zero; always-ready instances would bill while idle.
  // checkov:skip=CKV_AZURE_16:The app always has a managed identity: identity.type is the identityType parameter, @allowed SystemAssigned or UserAssigned (with the identity created above); the check accepts only a literal type. tests/repo/test_infra.py checks both branches.
  // checkov:skip=CKV_AZURE_213:The only HTTP endpoint is the monitor behind Entra sign-in, which a health probe could not pass; liveness is watched by the dead-man's switch alert on RunSucceeded events (alerts.bicep).
  name: functionAppName
  location: location
  // azd publishes the `agent` service of azure.yaml to the app carrying this tag.
  tags: union(tags, {
    'azd-service-name': 'agent'
  })
  kind: 'functionapp,linux'
  // identityType is SystemAssigned or UserAssigned (@allowed); with UserAssigned, the identity above.
  identity: {
    type: identityType
    userAssignedIdentities: useUserAssignedIdentity ? {
      '${appIdentity.id}': {}
    } : null
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // Flex Consumption VNet integration (subnet delegated to Microsoft.App/environments): the app
    // reaches SQL and storage through their private endpoints. The app itself stays public: the
    // monitor is opened in a browser, behind Entra ID sign-in.
    virtualNetworkSubnetId: empty(appSubnetId) ? null : appSubnetId
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: concat(engineAppSettings, userAssignedIdentitySettings, hostAppSettings, jobAppSettings)
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobServiceUri}/${deploymentContainerName}'
          authentication: useUserAssignedIdentity ? {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: appIdentity.id
          } : {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      runtime: {
        name: 'python'
        version: pythonVersion
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
    }
  }
}

// ---------------------------------------------------------------- sign-in for the monitor
//
// App Service Authentication in front of the whole app: every HTTP request must carry an Entra ID
// sign-in (browsers are redirected to it), Entra ID is the only provider, and only members of
// monitorAllowedGroupObjectId are admitted (the token's `groups` claim: the app registration
// needs groupMembershipClaims "ApplicationGroup" and the group assigned; docs/monitor.md). Until
// both the client id and the group are given, no provider is enabled and every request gets 401.
// The timer and queue triggers are not HTTP and are not affected.

var monitorConfigured = !empty(monitorEntraClientId) && !empty(monitorAllowedGroupObjectId)

resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  // Checkov runs its site-config checks on every Microsoft.Web/sites/config resource; this one is
  // the sign-in configuration (authsettingsV2), which has none of those properties:
  // checkov:skip=CKV_AZURE_13:This resource is App Service Authentication itself (platform.enabled, requireAuthentication, Entra ID only); the check looks for the older siteAuthEnabled flag.
  // checkov:skip=CKV_AZURE_63:authsettingsV2 has no logging properties; the Functions host logs every HTTP request to Application Insights.
  // checkov:skip=CKV_AZURE_65:authsettingsV2 has no error-page properties; detailed error pages are an IIS (Windows) feature and this is a Linux app.
  // checkov:skip=CKV_AZURE_66:authsettingsV2 has no tracing properties; failed request tracing is an IIS (Windows) feature, and the requests are traced in Application Insights.
  // checkov:skip=CKV_AZURE_80:authsettingsV2 has no runtime properties, and the app runs Python, not .NET.
  // checkov:skip=CKV_AZURE_88:authsettingsV2 has no storage properties; the app mounts no Azure Files share (Flex Consumption deploys from a blob container).
  // checkov:skip=CKV_AZURE_222:authsettingsV2 has no network properties; the monitor is opened by people in a browser, so the app stays public, behind Entra ID sign-in for every request.
  parent: functionApp
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: monitorConfigured ? 'RedirectToLoginPage' : 'Return401'
      redirectToProvider: 'azureactivedirectory'
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: monitorConfigured
        registration: {
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
          clientId: monitorEntraClientId
          clientSecretSettingName: empty(monitorClientSecretSettingName) ? null : monitorClientSecretSettingName
        }
        validation: {
          allowedAudiences: [
            'api://${monitorEntraClientId}'
            monitorEntraClientId
          ]
          defaultAuthorizationPolicy: {
            allowedPrincipals: {
              groups: [
                monitorAllowedGroupObjectId
              ]
            }
          }
        }
      }
      apple: {
        enabled: false
      }
      facebook: {
        enabled: false
      }
      gitHub: {
        enabled: false
      }
      google: {
        enabled: false
      }
      twitter: {
        enabled: false
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
    }
  }
}

// ---------------------------------------------------------------- access for the app's identity
//
// Identity-based AzureWebJobsStorage, as the Functions docs describe it ("Connecting to host
// storage with an identity"), for what this app does with the account. All three are scoped to
// the storage account, which storage.bicep creates for this app alone.

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

// Blobs: the host's own storage (singleton and timer-trigger locks as blob leases, timer schedule
// status, keys; it creates its containers) and the Flex Consumption deployment container the app
// reads its package from. Storage Blob Data Owner is the role the Functions docs require here.
resource blobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, granteeId, storageBlobDataOwnerRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwnerRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Functions host storage (locks, timer status, keys) and the Flex Consumption deployment package.'
  }
}

// Queues: the queue trigger receives, hides and deletes task messages; the timer tick sends them;
// the host adds a message to <queue>-poison when it gives up on it, creating that queue if it is
// missing. Sending, receiving and creating a queue together need Storage Queue Data Contributor.
resource queueDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, granteeId, storageQueueDataContributorRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributorRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Queue trigger, dispatch by the timer tick, and the poison queue the host writes to.'
  }
}

// Tables: the host writes its diagnostic events to a table (AzureWebJobsStorage__tableServiceUri).
resource tableDataContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, granteeId, storageTableDataContributorRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributorRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Functions host diagnostic events (a table).'
  }
}

// Telemetry: with local authentication disabled on the Application Insights component, the host
// and the engine send with the app's Entra ID token; Monitoring Metrics Publisher is the role
// ingestion requires.
resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, granteeId, monitoringMetricsPublisherRoleId)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisherRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Telemetry ingestion with Entra ID (the component has local authentication disabled).'
  }
}

output functionAppName string = functionApp.name
output functionAppId string = functionApp.id
output principalId string = appPrincipalId
@description('The app\'s database user: the name of the identity it runs as (grant-sql --app-name).')
output databaseUserName string = databaseUserName
@description('Client id of the user-assigned identity; empty with the system-assigned one.')
output identityClientId string = useUserAssignedIdentity ? appIdentity.properties.clientId : ''
output defaultHostName string = functionApp.properties.defaultHostName
output monitorUrl string = 'https://${functionApp.properties.defaultHostName}/api/monitor/'
