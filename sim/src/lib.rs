//! kuport's simulator: a model of the Kubernetes API server subset kuport uses
//! ([`apiserver`]), served over HTTP on any listener, for the simulator, the lab and the
//! agent's tests.

pub mod apiserver;
