// Package clientv1 is the Go code generated from client.proto, the client
// service of an oncewal node (oncewal.client.v1.Client), plus its limits
// (limits.go). Package clientapi serves it on a node; package client calls
// it; any language generates its own client from client.proto.
package clientv1
