// Storage: the account the Functions host and the engine share. Entra ID only (no shared
// keys), no anonymous blob access, HTTPS with TLS 1.2. It holds:
//   - the task queue the timer dispatches to and the queue trigger reads, and its poison queue;
//   - the blob container the Flex Consumption plan deploys the app package from;
//   - the host's own blobs (singleton locks, timer schedule status), created by the host.
// The app's role assignments on this account are declared in functionapp.bicep, next to an
// `existing` reference to it.

@description('Azure region of the resources.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Storage account name: 3-24 lowercase letters and digits, globally unique.')
@minLength(3)
@maxLength(24)
param storageAccountName string

@description('Replication of the storage account.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param skuName string = 'Standard_LRS'

@description('Queue the timer dispatches runs to and the queue trigger reads (AGENT_QUEUE_NAME).')
param queueName string

@description('Blob container the Flex Consumption plan deploys the app package from.')
param deploymentContainerName string

@description('Resource id of the Log Analytics workspace that receives the queue and blob access logs.')
param workspaceId string

@description('public: the account\'s public endpoint, Entra ID only. private: public network access off; the app reaches blob, queue and table through private endpoints (network.bicep).')
@allowed([
  'public'
  'private'
])
param networkProfile string

var isPrivate = networkProfile == 'private'

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35:(networkProfile public) Flex Consumption without VNet integration reaches storage over the public endpoint; every request needs an Entra ID token (shared keys are off). networkProfile private denies it.
  // checkov:skip=CKV_AZURE_59:(networkProfile public) Same reason as CKV_AZURE_35: public endpoint, Entra ID RBAC only; networkProfile private turns public network access off.
  // checkov:skip=CKV_AZURE_206:Queue messages are doorbells and the package is rebuilt on publish; the database is the source of truth. Replication is the skuName parameter.
  // checkov:skip=CKV_AZURE_43:The name is the storageAccountName parameter, which main.bicep derives as lowercase 'st' + letters and digits, at most 24 characters.
  name: storageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    isLocalUserEnabled: false
    isSftpEnabled: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: isPrivate ? 'Disabled' : 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: isPrivate ? 'Deny' : 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storageAccount
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: storageAccount
  name: 'default'
}

resource tasksQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: queueName
}

// The Functions host moves a message here when it gives up on it: a body that is not valid
// base64, a delivery that failed (the function raised, timed out or its worker crashed) at
// host.json maxDequeueCount, or a delivery whose dequeue count is already above it. The engine
// records its own poison in the database first whenever it can; docs/queue.md lists exactly which
// messages end here instead.
resource poisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: '${queueName}-poison'
}

// Queue and blob data-plane logs (who read, wrote or deleted what) to the workspace.
resource queueDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'queue-to-log-analytics'
  scope: queueService
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'StorageRead'
        enabled: true
      }
      {
        category: 'StorageWrite'
        enabled: true
      }
      {
        category: 'StorageDelete'
        enabled: true
      }
    ]
  }
}

resource blobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'blob-to-log-analytics'
  scope: blobService
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'StorageWrite'
        enabled: true
      }
      {
        category: 'StorageDelete'
        enabled: true
      }
    ]
  }
}

output storageAccountName string = storageAccount.name
output storageAccountId string = storageAccount.id
output deploymentContainerName string = deploymentContainer.name
output queueName string = tasksQueue.name
output poisonQueueName string = poisonQueue.name
output blobEndpoint string = storageAccount.properties.primaryEndpoints.blob
output queueEndpoint string = storageAccount.properties.primaryEndpoints.queue
