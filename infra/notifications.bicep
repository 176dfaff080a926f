// Operators notified of job outcomes by e-mail through Azure Monitor, SQL Server Agent's
// "notify operator on failure / success / completion", with no code in the function app:
//   - an action group whose e-mail receivers come from a parameter (empty: no receivers; add
//     SMS, webhooks or other groups in the portal or through actionGroupIds);
//   - a log alert per notify rule on the engine's run-finished events in Application Insights
//     (customEvents): failed or poisoned runs of the jobs whose notify is on_failure (the
//     default) or on_completion, and successful runs of the jobs whose notify is on_success or
//     on_completion. Both split by job, so each job fires and resolves on its own.
// The engine's own webhook (AGENT_NOTIFY_WEBHOOK_URL) follows the same per-job notify setting.

@description('Azure region of the alert rules.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Prefix of the resource names.')
param namePrefix string

@description('Application Insights component the engine reports to.')
param appInsightsName string

@description('The jobs parameter of main.bicep: each entry\'s name and notify (on_failure when absent, on_success, on_completion, never).')
param jobs array

@description('E-mail addresses notified; empty creates an action group without receivers.')
param emails array

@description('Existing action groups notified too (resource ids).')
param actionGroupIds array

@description('Severity of the alerts: 0 critical to 4 verbose.')
@minValue(0)
@maxValue(4)
param severity int

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource operators 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: '${namePrefix}-job-notify'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'sqlagentjobs'
    enabled: true
    emailReceivers: [for (email, i) in emails: {
      name: 'operator${i + 1}'
      emailAddress: email
      useCommonAlertSchema: true
    }]
  }
}

var failureJobs = [for job in filter(jobs, job => contains(['on_failure', 'on_completion'], job.?notify ?? 'on_failure')): job.name]
var successJobs = [for job in filter(jobs, job => contains(['on_success', 'on_completion'], job.?notify ?? 'on_failure')): job.name]

// {JOBS} becomes a JSON array of job names. A run failed for good sends RunFailed with
// outcome failed (a worker that lost its lease sends outcome lease_lost: not an outcome).
var failedRunQueryTemplate = '''
customEvents
| where (name == "RunFailed" and tostring(customDimensions.outcome) == "failed") or name == "RunPoisoned"
| extend job = tostring(customDimensions.job)
| where job in (dynamic({JOBS}))
| project timestamp, job, run_id = tostring(customDimensions.run_id), step = tostring(customDimensions.step), error_message = tostring(customDimensions.error_message)
'''
var succeededRunQueryTemplate = '''
customEvents
| where name == "RunSucceeded"
| extend job = tostring(customDimensions.job)
| where job in (dynamic({JOBS}))
| project timestamp, job, run_id = tostring(customDimensions.run_id)
'''
var failedRunQuery = replace(failedRunQueryTemplate, '{JOBS}', string(failureJobs))
var succeededRunQuery = replace(succeededRunQueryTemplate, '{JOBS}', string(successJobs))
var notifiedGroups = concat([operators.id], actionGroupIds)

resource jobFailed 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = if (!empty(failureJobs)) {
  name: '${namePrefix}-job-failed'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'SQL agent: job run failed'
    description: 'A run of a job whose notify is on_failure or on_completion failed (RunFailed) or was poisoned (RunPoisoned). history --job NAME --output shows its steps, errors and output.'
    severity: severity
    enabled: true
    scopes: [
      appInsights.id
    ]
    // The window overlaps the frequency to absorb ingestion delay; the alert is stateful
    // (autoMitigate), so an event seen by two evaluations notifies once.
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: failedRunQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          dimensions: [
            {
              name: 'job'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: notifiedGroups
    }
  }
}

resource jobSucceeded 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = if (!empty(successJobs)) {
  name: '${namePrefix}-job-succeeded'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'SQL agent: job run succeeded'
    description: 'A run of a job whose notify is on_success or on_completion succeeded (RunSucceeded).'
    severity: 4
    enabled: true
    scopes: [
      appInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: succeededRunQuery
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          dimensions: [
            {
              name: 'job'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: notifiedGroups
    }
  }
}

output actionGroupId string = operators.id
output failedRuleName string = empty(failureJobs) ? '' : jobFailed.name
output succeededRuleName string = empty(successJobs) ? '' : jobSucceeded.name
