// Monitoring: a Log Analytics workspace and a workspace-based Application Insights component.
// The engine and the Functions host send telemetry (traces, and the RunSucceeded / RunFailed /
// RunPoisoned custom events) to Application Insights; its data lands in the workspace.

@description('Azure region of the resources.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Name of the Log Analytics workspace.')
param workspaceName string

@description('Name of the Application Insights component.')
param appInsightsName string

@description('Days the workspace keeps data (30 to 730): telemetry, storage access logs and the SQL audit log. Run history lives in the database.')
@minValue(30)
@maxValue(730)
param retentionInDays int

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: workspaceName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      enableLogAccessUsingOnlyResourcePermissions: true
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: appInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    IngestionMode: 'LogAnalytics'
    // Entra ID only: the function app sends with its identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING,
    // Monitoring Metrics Publisher granted in functionapp.bicep); the instrumentation key alone
    // cannot write.
    DisableLocalAuth: true
  }
}

// The Azure Monitor workbook of docs/monitoring.md's queries (infra/workbook.json): runs per job
// over time by outcome, duration percentiles, slot lateness, poison and the dead man's switch,
// on this Application Insights resource (Monitor > Workbooks, or the resource's Workbooks blade).
// Its name is a GUID, as workbooks require; tests/integration/test_workbook.py checks every query's tables,
// columns, event, metric and dimension names against what the engine writes.
resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, appInsightsName, 'sql-agent-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'SQL Agent (${appInsightsName})'
    category: 'workbook'
    sourceId: appInsights.id
    version: '1.0'
    serializedData: replace(loadTextContent('workbook.json'), '__APP_INSIGHTS_ID__', appInsights.id)
  }
}

output workspaceId string = workspace.id
output workspaceName string = workspace.name
output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
output workbookId string = workbook.id
