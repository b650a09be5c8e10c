//! kuport's simulator: a model of the Kubernetes API server subset kuport uses, and seeded
//! whole-cluster simulations over it. Nothing is implemented yet; see the API-server-model issue.
