// Package proto holds the published .proto files of oncewal's services and
// the Go code generated from them (protoc with protoc-gen-go and
// protoc-gen-go-grpc, the versions go.mod's tool directives pin).
//
// Regenerate after editing a .proto with
//
//	go generate ./proto
//
// which needs protoc on PATH (Debian: apt-get install protobuf-compiler).
// CI regenerates and fails if the committed code differs.
package proto

//go:generate sh generate.sh
