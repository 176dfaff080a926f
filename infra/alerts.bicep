// Alerts on the engine's custom events in Application Insights (customEvents table; the
// engine emits RunSucceeded, RunFailed and RunPoisoned with customDimensions job, run_id and
// scheduled_for):
//   - dead-man's switch: a listed job had no RunSucceeded event within the last N hours. It
//     watches the outcome, independently of the timer, so it also fires when nothing runs at all
//     (app stopped, timer not firing, database unreachable);
//   - poison: any RunPoisoned event.
// Both alerts split by job, so each job fires and resolves on its own.

@description('Azure region of the alert rules.')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Prefix of the alert rule names.')
param namePrefix string

@description('Application Insights component the engine reports to.')
param appInsightsName string

@description('Jobs that must succeed at least once every `maxHoursWithoutSuccess` hours; an empty list creates no dead-man\'s switch rule.')
param deadMansSwitchJobs array

@description('Hours a listed job may go without a RunSucceeded event before the alert fires (1 to 48, the longest window of a log alert).')
@minValue(1)
@maxValue(48)
param maxHoursWithoutSuccess int

@description('Action groups notified when an alert fires (resource ids).')
param actionGroupIds array

@description('E-mail address notified through an action group created here; empty creates none.')
param alertEmail string

@description('Severity of both alerts: 0 critical to 4 verbose.')
@minValue(0)
@maxValue(4)
param severity int

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource emailActionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmail)) {
  name: '${namePrefix}-agent-alerts'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'sqlagent'
    enabled: true
    emailReceivers: [
      {
        name: 'operator'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

var allActionGroupIds = empty(alertEmail) ? actionGroupIds : concat(actionGroupIds, [emailActionGroup.id])

// Expected jobs left-anti-joined with the jobs that did succeed: one row per silent job.
// {JOBS} becomes a JSON array of job names, {HOURS} the number of hours.
var deadMansSwitchQueryTemplate = '''
let succeeded = customEvents
    | where timestamp > ago({HOURS}h)
    | where name == "RunSucceeded"
    | summarize by job = tostring(customDimensions.job);
print job = dynamic({JOBS})
| mv-expand job to typeof(string)
| join kind=leftanti succeeded on job
'''
var deadMansSwitchQuery = replace(replace(deadMansSwitchQueryTemplate, '{JOBS}', string(deadMansSwitchJobs)), '{HOURS}', string(maxHoursWithoutSuccess))

var poisonQuery = '''
customEvents
| where name == "RunPoisoned"
| project timestamp, job = tostring(customDimensions.job), run_id = tostring(customDimensions.run_id), scheduled_for = tostring(customDimensions.scheduled_for)
'''

// The agent raises deadline alerts itself (JOB__<name>__DEADLINE_SECONDS, and duration alerts with
// MAX_DURATION_SECONDS / STOP_AFTER_SECONDS / SLOWER_THAN: docs/configuration.md#alerts-on-duration-and-deadlines),
// once per slot, through its webhook and the AlertRaised event. This rule stays: it is the dead
// man's switch for an agent that stopped ticking (then nothing inside the agent can say so).
resource deadMansSwitch 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = if (!empty(deadMansSwitchJobs)) {
  name: '${namePrefix}-job-missed-success'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'SQL agent: job without a successful run for ${maxHoursWithoutSuccess} h'
    description: 'A listed job had no RunSucceeded event in Application Insights for ${maxHoursWithoutSuccess} hours. Check the runs table and the RunFailed / RunPoisoned events of the job.'
    severity: severity
    enabled: true
    scopes: [
      appInsights.id
    ]
    // The query itself looks back maxHoursWithoutSuccess hours (ago() above); the rule's window
    // only has to cover it, so it is the longest a log alert allows.
    evaluationFrequency: 'PT1H'
    windowSize: 'P2D'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: deadMansSwitchQuery
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
      actionGroups: allActionGroupIds
    }
  }
}

resource poisoned 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-run-poisoned'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'SQL agent: run poisoned'
    description: 'A run was poisoned (RunPoisoned event): it will not be retried. The poison table holds the message, every error and the run; requeue it with the CLI once fixed.'
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
          query: poisonQuery
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
      actionGroups: allActionGroupIds
    }
  }
}

output deadMansSwitchRuleName string = empty(deadMansSwitchJobs) ? '' : deadMansSwitch.name
output poisonRuleName string = poisoned.name
