module github.com/edge-gateway/gateway/plugins/go-headers

go 1.24

require github.com/proxy-wasm/proxy-wasm-go-sdk v0.0.0-20260105142703-44c7d5847745
