// A stand-in for sigs.k8s.io/mcs-api/controllers, whose source the Go module proxy refuses
// (403 on every version's zip). Cilium imports one constant from it; see ../../go.mod.
module sigs.k8s.io/mcs-api/controllers

go 1.23.0
