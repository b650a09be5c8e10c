// Package controllers holds the one name Cilium v1.20 takes from sigs.k8s.io/mcs-api/controllers:
// the annotation the Multi-Cluster Services API (KEP-1645) puts on a ServiceImport to name the
// Service derived from it. Only Cilium's ClusterMesh MCS support reads it, which the local
// cluster leaves off.
package controllers

// DerivedServiceAnnotation names the Service derived from a ServiceImport.
const DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"
