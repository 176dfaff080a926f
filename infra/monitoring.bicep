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

output workspaceId string = workspace.id
output workspaceName string = workspace.name
output appInsightsId string = appInsights.id
output appInsightsName string = appInsights.name
