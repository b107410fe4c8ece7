#!/bin/sh
# Generates the Go code of every .proto under this directory, with the
# plugins pinned by go.mod's tool directives. Run from this directory (go
# generate does).
set -eu
go_plugin=$(go tool -n protoc-gen-go)
grpc_plugin=$(go tool -n protoc-gen-go-grpc)
find . -name '*.proto' | sort | xargs protoc -I . \
	--plugin=protoc-gen-go="$go_plugin" --go_out=. --go_opt=paths=source_relative \
	--plugin=protoc-gen-go-grpc="$grpc_plugin" --go-grpc_out=. --go-grpc_opt=paths=source_relative
