// Azure SQL: a logical server that accepts Entra ID logins only, and the control
// database (a provisioned S tier, or serverless, with or without the free offer: tier) that holds jobs, runs, history and the poison table. The function app's managed
// identity becomes a database user after deployment (T-SQL, see the deployment guide); no
// SQL password exists anywhere.

@description('Azure region of the resources.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Logical server name: lowercase letters, digits and hyphens, globally unique.')
@minLength(1)
@maxLength(63)
param sqlServerName string

@description('Control database name (AGENT_SQL_DATABASE).')
param databaseName string

@description('Display name of the Entra ID administrator of the server (a user or, better, a group).')
param adminLogin string

@description('Object id of that Entra ID user, group or service principal.')
param adminObjectId string

@description('Kind of principal the administrator is.')
@allowed([
  'User'
  'Group'
  'Application'
])
param adminPrincipalType string

// The control database's tier (sqlTier). Serverless (GP_S_Gen5) bills per vCore-second while the
// database is online, at least its minimum vCores; S0 to S3 are provisioned DTU tiers at a flat
// monthly price with 250 GB included; ServerlessFree is serverless with the Azure SQL Database free
// offer (useFreeLimit: 100,000 vCore-seconds, 32 GB of data and 32 GB of backups free each month,
// up to 10 such databases per subscription). docs/deploying.md ("The database tier") explains the
// default from the list prices.
@description('Tier of the control database: S0, S1, S2, S3 (provisioned DTUs), Serverless (GP_S_Gen5) or ServerlessFree (GP_S_Gen5 with the free offer).')
@allowed([
  'S0'
  'S1'
  'S2'
  'S3'
  'Serverless'
  'ServerlessFree'
])
param tier string

@description('tier ServerlessFree only: BillOverUsage or AutoPause when the month\'s free amount is used up.')
@allowed([
  'BillOverUsage'
  'AutoPause'
])
param freeLimitExhaustionBehavior string

@description('Most vCores the serverless database scales up to.')
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
param maxVCores int

@description('Fewest vCores while the database is online, as a decimal string (at least a fraction of maxVCores).')
@allowed([
  '0.5'
  '0.75'
  '1'
  '1.25'
  '1.5'
  '1.75'
  '2'
])
param minVCores string

@description('Minutes without activity before the database pauses; -1 never pauses. Otherwise at least 15. A paused database resumes on the next tick (first connection fails with 40613 and is retried).')
@minValue(-1)
@maxValue(10080)
param autoPauseDelayMinutes int

@description('Largest size of the database, in GB.')
@minValue(1)
@maxValue(1024)
param maxSizeGB int

@description('Where backups are stored.')
@allowed([
  'Local'
  'Zone'
  'Geo'
])
param backupStorageRedundancy string

@description('public: the server\'s public endpoint, Entra ID logins only, the firewall admitting Azure services. private: public network access off; reached through a private endpoint (network.bicep).')
@allowed([
  'public'
  'private'
])
param networkProfile string

var isPrivate = networkProfile == 'private'

@description('Resource id of the Log Analytics workspace that receives the SQL audit log.')
param workspaceId string

resource sqlServer 'Microsoft.Sql/servers@2023-08-01' = {
  // checkov:skip=CKV_AZURE_113:(networkProfile public) Flex Consumption without VNet integration reaches SQL over the public endpoint; logins are Entra ID only and the firewall admits Azure services only. networkProfile private turns public network access off.
  // checkov:skip=CKV_AZURE_24:The audit goes to Log Analytics and is kept for the workspace retention (logRetentionInDays, default 90); retentionDays applies to a storage target only.
  // checkov:skip=CKV_AZURE_25:Microsoft Defender for SQL (threat detection) is a paid plan that belongs to the subscription's Defender for Cloud settings, not to this template.
  name: sqlServerName
  location: location
  tags: tags
  properties: {
    minimalTlsVersion: '1.2'
    publicNetworkAccess: isPrivate ? 'Disabled' : 'Enabled'
    restrictOutboundNetworkAccess: 'Disabled'
    administrators: {
      administratorType: 'ActiveDirectory'
      azureADOnlyAuthentication: true
      login: adminLogin
      sid: adminObjectId
      principalType: adminPrincipalType
      tenantId: subscription().tenantId
    }
  }
}

// 0.0.0.0 - 0.0.0.0 is Azure's convention for "connections from Azure services": a Flex
// Consumption app without VNet integration has no fixed outbound address. Logins still need
// an Entra ID token for a user that exists in the database. Not with the private profile: a server
// whose public network access is off takes no firewall rule.
resource allowAzureServices 'Microsoft.Sql/servers/firewallRules@2023-08-01' = if (!isPrivate) {
  parent: sqlServer
  name: 'AllowAllWindowsAzureIps'
  properties: {
    startIpAddress: '0.0.0.0'
    endIpAddress: '0.0.0.0'
  }
}

var serverless = (tier == 'Serverless') || (tier == 'ServerlessFree')
var useFreeLimit = tier == 'ServerlessFree'

// The free offer's properties (useFreeLimit, freeLimitExhaustionBehavior) exist in the preview API
// versions only (2023-02-01-preview and later; not in the stable 2023-08-01).
resource database 'Microsoft.Sql/servers/databases@2024-11-01-preview' = {
  // checkov:skip=CKV_AZURE_23:Auditing is set on the server (resource auditing), which covers every database; database-level auditing would duplicate each record.
  // checkov:skip=CKV_AZURE_25:Defender for SQL threat detection is a subscription-level paid plan (see the server).
  // checkov:skip=CKV_AZURE_26:Alert e-mails belong to Defender for SQL threat detection, a subscription-level paid plan (see the server).
  // checkov:skip=CKV_AZURE_27:Alert e-mails belong to Defender for SQL threat detection, a subscription-level paid plan (see the server).
  // checkov:skip=CKV_AZURE_229:Zone redundancy roughly doubles the price; after a zone outage due runs catch up under each job's misfire policy.
  parent: sqlServer
  name: databaseName
  location: location
  tags: tags
  sku: serverless ? {
    name: 'GP_S_Gen5'
    tier: 'GeneralPurpose'
    family: 'Gen5'
    capacity: maxVCores
  } : {
    name: tier
    tier: 'Standard'
  }
  properties: {
    // Serverless only; an S tier has neither, and its size is the 250 GB its price includes.
    autoPauseDelay: serverless ? autoPauseDelayMinutes : null
    minCapacity: serverless ? json(minVCores) : null
    maxSizeBytes: serverless ? maxSizeGB * 1073741824 : null
    requestedBackupStorageRedundancy: backupStorageRedundancy
    zoneRedundant: false
    useFreeLimit: useFreeLimit
    freeLimitExhaustionBehavior: useFreeLimit ? freeLimitExhaustionBehavior : null
  }
}

// Server audit log to Log Analytics: auditing targets Azure Monitor, and the diagnostic setting
// on the master database routes the SQLSecurityAuditEvents category to the workspace.
resource auditing 'Microsoft.Sql/servers/auditingSettings@2023-08-01' = {
  parent: sqlServer
  name: 'default'
  properties: {
    state: 'Enabled'
    isAzureMonitorTargetEnabled: true
  }
}

resource masterDatabase 'Microsoft.Sql/servers/databases@2023-08-01' existing = {
  // checkov:skip=CKV_AZURE_23:Existing reference to master, only the scope of the audit diagnostic setting; the server's auditing covers it.
  // checkov:skip=CKV_AZURE_25:Existing reference to master; Defender for SQL is a subscription-level paid plan (see the server).
  parent: sqlServer
  name: 'master'
}

resource auditDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  name: 'sql-audit-to-log-analytics'
  scope: masterDatabase
  properties: {
    workspaceId: workspaceId
    logs: [
      {
        category: 'SQLSecurityAuditEvents'
        enabled: true
      }
    ]
  }
}

output sqlServerName string = sqlServer.name
output sqlServerId string = sqlServer.id
output sqlServerFqdn string = sqlServer.properties.fullyQualifiedDomainName
output databaseName string = database.name
