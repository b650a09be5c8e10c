//! kuport's host layer: the only code that touches a node's kernel. It will turn the datapath IR
//! from `kuport-core` into nftables, VXLAN links, ip rules and routes, and read back the host
//! facts the plan needs. Nothing is implemented yet; see the host-layer issue.
