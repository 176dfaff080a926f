// Private networking (main.bicep's networkProfile 'private'): the function app joins a subnet of a
// virtual network (Flex Consumption VNet integration), and the SQL server and the storage account
// are reached through private endpoints in another subnet, their names resolved by private DNS
// zones linked to the network. main.bicep turns public network access off on both.
//
// The network is created here (vnetId empty: two subnets, each with a network security group), or
// it is the team's (vnetId: an existing network in this region, with both subnets already made
// and the app's subnet delegated to Microsoft.App/environments). The DNS zones are created and
// linked here unless createPrivateDnsZones is false (a hub network whose central zones and
// policies add the records: the endpoints are then made without DNS zone groups).

@description('Azure region of the resources (the network\'s too).')
param location string

@description('Tags applied to every resource.')
param tags object

@description('Name of the virtual network to create (ignored with vnetId).')
param vnetName string

@description('Resource id of an existing virtual network in this region; empty: create vnetName.')
param vnetId string

@description('Address space of the network to create (ignored with vnetId).')
param vnetAddressPrefix string

@description('Subnet the function app integrates with: created here, or existing in vnetId and delegated to Microsoft.App/environments (at least /27).')
param appSubnetName string

@description('Address range of the app subnet to create (ignored with vnetId).')
param appSubnetPrefix string

@description('Subnet of the private endpoints: created here, or existing in vnetId.')
param privateEndpointSubnetName string

@description('Address range of the private endpoint subnet to create (ignored with vnetId).')
param privateEndpointSubnetPrefix string

@description('Create the privatelink DNS zones and link them to the network; false: your DNS resolves the endpoints\' names.')
param createPrivateDnsZones bool

@description('Resource id of the Azure SQL logical server.')
param sqlServerId string

@description('Resource id of the storage account.')
param storageAccountId string

@description('Name prefix of the resources created here.')
param namePrefix string

var createVnet = empty(vnetId)
var networkId = createVnet ? virtualNetwork.id : vnetId

// The services the app reaches privately, and their privatelink zones: the SQL server, and the
// storage account's blob (host storage, the deployment package), queue (the task queue, the poison
// queue) and table (the host's diagnostic events) services, the three it uses.
var endpoints = [
  {
    name: 'sql'
    serviceId: sqlServerId
    groupId: 'sqlServer'
    zone: 'privatelink${environment().suffixes.sqlServerHostname}'
  }
  {
    name: 'blob'
    serviceId: storageAccountId
    groupId: 'blob'
    zone: 'privatelink.blob.${environment().suffixes.storage}'
  }
  {
    name: 'queue'
    serviceId: storageAccountId
    groupId: 'queue'
    zone: 'privatelink.queue.${environment().suffixes.storage}'
  }
  {
    name: 'table'
    serviceId: storageAccountId
    groupId: 'table'
    zone: 'privatelink.table.${environment().suffixes.storage}'
  }
]

// No rule of its own: the defaults allow traffic inside the network and outbound, and deny inbound
// from the internet. The app subnet's traffic is outbound (to the endpoints, and to Azure
// Monitor's public ingestion); the endpoints receive from inside the network only.
resource networkSecurityGroup 'Microsoft.Network/networkSecurityGroups@2023-11-01' = if (createVnet) {
  name: '${namePrefix}-nsg'
  location: location
  tags: tags
  properties: {
    securityRules: []
  }
}

resource virtualNetwork 'Microsoft.Network/virtualNetworks@2023-11-01' = if (createVnet) {
  name: vnetName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        vnetAddressPrefix
      ]
    }
    subnets: [
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          networkSecurityGroup: {
            id: networkSecurityGroup.id
          }
          // Flex Consumption VNet integration needs its subnet delegated to this service.
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: privateEndpointSubnetName
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          networkSecurityGroup: {
            id: networkSecurityGroup.id
          }
          privateEndpointNetworkPolicies: 'Disabled'
        }
      }
    ]
  }
}

resource privateDnsZones 'Microsoft.Network/privateDnsZones@2020-06-01' = [for endpoint in endpoints: if (createPrivateDnsZones) {
  name: endpoint.zone
  location: 'global'
  tags: tags
}]

resource privateDnsZoneLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [for (endpoint, i) in endpoints: if (createPrivateDnsZones) {
  parent: privateDnsZones[i]
  name: '${namePrefix}-link'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: networkId
    }
  }
}]

resource privateEndpoints 'Microsoft.Network/privateEndpoints@2023-11-01' = [for endpoint in endpoints: {
  name: '${namePrefix}-pe-${endpoint.name}'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: '${networkId}/subnets/${privateEndpointSubnetName}'
    }
    privateLinkServiceConnections: [
      {
        name: endpoint.name
        properties: {
          privateLinkServiceId: endpoint.serviceId
          groupIds: [
            endpoint.groupId
          ]
        }
      }
    ]
  }
}]

resource privateDnsZoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2023-11-01' = [for (endpoint, i) in endpoints: if (createPrivateDnsZones) {
  parent: privateEndpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: endpoint.name
        properties: {
          privateDnsZoneId: privateDnsZones[i].id
        }
      }
    ]
  }
}]

@description('Resource id of the subnet the function app integrates with.')
output appSubnetId string = '${networkId}/subnets/${appSubnetName}'
@description('Resource id of the virtual network.')
output vnetId string = networkId
