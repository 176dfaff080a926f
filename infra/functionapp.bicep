// The function app: Flex Consumption plan, Python 3.11, a system-assigned managed identity,
// identity-based storage, and every app setting the engine reads (shared/config.py). Job
// schedules are app settings (JOB__<name>__<SETTING>) built from the `jobs` parameter, so a
// schedule can change later with `az functionapp config appsettings set` and no code deploy.
//
// The identity's role assignments are at the end of this file, each next to an `existing`
// reference to the resource it grants, with the narrowest built-in role that works.

@description('Azure region of the resources.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Function app name: globally unique, becomes <name>.azurewebsites.net and the database user name.')
param functionAppName string

@description('Flex Consumption plan name.')
param planName string

@description('Storage account the host and the engine use (created by storage.bicep).')
param storageAccountName string

@description('Blob container the app package is deployed to (created by storage.bicep).')
param deploymentContainerName string

@description('Queue the timer dispatches to and the queue trigger reads (created by storage.bicep).')
param queueName string

@description('Poison queue the host moves messages to after maxDequeueCount deliveries.')
param poisonQueueName string

@description('Application Insights component (created by monitoring.bicep).')
param appInsightsName string

@description('Fully qualified name of the Azure SQL logical server.')
param sqlServerFqdn string

@description('Control database name.')
param sqlDatabaseName string

@description('Six-field NCRONTAB of the engine tick (seconds first, UTC).')
param tickSchedule string

@description('Deliveries after which the engine poisons a message; at or below host.json maxDequeueCount.')
@minValue(1)
@maxValue(100)
param maxDequeueCount int

@description('Jobs: [{ name, schedule, command, timezone?, enabled?, maxAttempts?, timeoutSeconds?, leaseSeconds?, misfire?, graceSeconds?, overlap?, database? }].')
param jobs array

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

// Built-in role definition ids (the same in every tenant).
var storageBlobDataOwnerRoleId = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageQueueDataReaderRoleId = '19e7f393-937e-4f77-808e-94535e297925'
var storageQueueDataMessageProcessorRoleId = '8a0f0c08-91a1-4084-bc3d-661d67233fed'
var storageQueueDataMessageSenderRoleId = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'

var blobServiceUri = 'https://${storageAccountName}.blob.${environment().suffixes.storage}'
var queueServiceUri = 'https://${storageAccountName}.queue.${environment().suffixes.storage}'

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// ---------------------------------------------------------------- app settings

// Settings the engine reads; names and meaning are in shared/config.py ENGINE_SETTINGS.
// tests/test_infra.py fails if this list and the engine's list drift apart.
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
]

// Settings only the Functions host reads (on the allow-list in tests/test_infra.py).
var hostAppSettings = [
  {
    // Host storage over the identity: singleton locks and timer schedule status are blobs.
    name: 'AzureWebJobsStorage__blobServiceUri'
    value: blobServiceUri
  }
]

// One list per field of a `jobs` entry; the setting suffix is the field name in UPPER_SNAKE.
// A missing required field (schedule, command) fails the deployment; a missing optional field
// gives a null value (safe dereference `.?`) and is dropped below. One loop per field rather
// than one per job: Bicep cannot nest for-expressions, and each loop allows 800 jobs.
var jobScheduleSettings = [for job in jobs: { name: 'JOB__${job.name}__SCHEDULE', value: job.schedule }]
var jobCommandSettings = [for job in jobs: { name: 'JOB__${job.name}__COMMAND', value: job.command }]
var jobTimezoneSettings = [for job in jobs: { name: 'JOB__${job.name}__TIMEZONE', value: job.?timezone }]
var jobEnabledSettings = [for job in jobs: { name: 'JOB__${job.name}__ENABLED', value: job.?enabled }]
var jobMaxAttemptsSettings = [for job in jobs: { name: 'JOB__${job.name}__MAX_ATTEMPTS', value: job.?maxAttempts }]
var jobTimeoutSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__TIMEOUT_SECONDS', value: job.?timeoutSeconds }]
var jobLeaseSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__LEASE_SECONDS', value: job.?leaseSeconds }]
var jobMisfireSettings = [for job in jobs: { name: 'JOB__${job.name}__MISFIRE', value: job.?misfire }]
var jobGraceSecondsSettings = [for job in jobs: { name: 'JOB__${job.name}__GRACE_SECONDS', value: job.?graceSeconds }]
var jobOverlapSettings = [for job in jobs: { name: 'JOB__${job.name}__OVERLAP', value: job.?overlap }]
var jobDatabaseSettings = [for job in jobs: { name: 'JOB__${job.name}__DATABASE', value: job.?database }]

var jobSettingCandidates = concat(jobScheduleSettings, jobCommandSettings, jobTimezoneSettings, jobEnabledSettings, jobMaxAttemptsSettings, jobTimeoutSecondsSettings, jobLeaseSecondsSettings, jobMisfireSettings, jobGraceSecondsSettings, jobOverlapSettings, jobDatabaseSettings)
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
  // checkov:skip=CKV_AZURE_222:The app has no HTTP triggers; the public endpoint serves `func azure functionapp publish` and the platform's host endpoints, which need keys or Entra ID.
  // checkov:skip=CKV_AZURE_17:No HTTP triggers, so no client to present certificates; the host admin endpoints are protected by keys.
  // checkov:skip=CKV_AZURE_212:Serverless by design: the timer and the queue trigger scale from zero; always-ready instances would bill while idle.
  // checkov:skip=CKV_AZURE_213:No HTTP endpoint to probe; liveness is watched by the dead-man's switch alert on RunSucceeded events (alerts.bicep).
  name: functionAppName
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: concat(engineAppSettings, hostAppSettings, jobAppSettings)
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobServiceUri}/${deploymentContainerName}'
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
    }
  }
}

// ---------------------------------------------------------------- access for the app's identity

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

// Host storage and deployment: the host takes singleton and timer locks as blob leases and
// creates its own containers; Flex Consumption reads the package from the deployment
// container. Storage Blob Data Owner is the role the Functions docs require for AzureWebJobsStorage.
resource blobDataOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, functionApp.id, storageBlobDataOwnerRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwnerRoleId)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
    description: 'Functions host storage (locks, timer status) and Flex Consumption deployment package.'
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: storageAccount
  name: 'default'
}

resource tasksQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = {
  parent: queueService
  name: queueName
}

// Dispatch: the timer tick sends {run_id, token} messages to the task queue.
resource tasksQueueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(tasksQueue.id, functionApp.id, storageQueueDataMessageSenderRoleId)
  scope: tasksQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageSenderRoleId)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
    description: 'Timer tick dispatches runs to the task queue.'
  }
}

// Trigger: the queue trigger receives and deletes messages (Message Processor) and reads the
// queue's properties (Reader); these two are the roles the Functions docs list for a queue trigger.
resource tasksQueueProcessor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(tasksQueue.id, functionApp.id, storageQueueDataMessageProcessorRoleId)
  scope: tasksQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageProcessorRoleId)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
    description: 'Queue trigger receives and deletes task messages.'
  }
}

resource tasksQueueReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(tasksQueue.id, functionApp.id, storageQueueDataReaderRoleId)
  scope: tasksQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataReaderRoleId)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
    description: 'Queue trigger reads the task queue properties (length, existence).'
  }
}

resource poisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = {
  parent: queueService
  name: poisonQueueName
}

// Poison: after maxDequeueCount deliveries the host adds the message to the poison queue.
resource poisonQueueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(poisonQueue.id, functionApp.id, storageQueueDataMessageSenderRoleId)
  scope: poisonQueue
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataMessageSenderRoleId)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
    description: 'Functions host moves messages that exhausted maxDequeueCount to the poison queue.'
  }
}

output functionAppName string = functionApp.name
output functionAppId string = functionApp.id
output principalId string = functionApp.identity.principalId
output defaultHostName string = functionApp.properties.defaultHostName
