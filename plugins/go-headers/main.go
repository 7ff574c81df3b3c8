// go-headers: a proxy-wasm plugin built with the proxy-wasm Go SDK and Go's own wasip1 target
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared). It adds `x-go-plugin: <value>` to
// responses (value from the JSON config's "value", default "hello"), copies the request's path
// into `x-go-path`, and answers `/go-teapot` itself with 418.
//
// A reactor never runs main(): registration happens in init().
package main

import (
	"encoding/json"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func init() {
	proxywasm.SetPluginContext(func(uint32) types.PluginContext { return &plugin{value: "hello"} })
}

func main() {}

type plugin struct {
	types.DefaultPluginContext
	value string
}

type config struct {
	Value string `json:"value"`
}

func (p *plugin) OnPluginStart(size int) types.OnPluginStartStatus {
	if size == 0 {
		return types.OnPluginStartStatusOK
	}
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		return types.OnPluginStartStatusFailed
	}
	var c config
	if err := json.Unmarshal(data, &c); err != nil {
		proxywasm.LogErrorf("bad configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if c.Value != "" {
		p.value = c.Value
	}
	return types.OnPluginStartStatusOK
}

func (p *plugin) NewHttpContext(uint32) types.HttpContext {
	return &headers{value: p.value}
}

type headers struct {
	types.DefaultHttpContext
	value string
	path  string
}

func (h *headers) OnHttpRequestHeaders(int, bool) types.Action {
	path, err := proxywasm.GetHttpRequestHeader(":path")
	if err == nil {
		h.path = path
	}
	if path == "/go-teapot" {
		_ = proxywasm.SendHttpResponse(418, [][2]string{{"x-go-plugin", h.value}}, []byte("short and stout\n"), -1)
		return types.ActionPause
	}
	return types.ActionContinue
}

func (h *headers) OnHttpResponseHeaders(int, bool) types.Action {
	_ = proxywasm.AddHttpResponseHeader("x-go-plugin", h.value)
	_ = proxywasm.AddHttpResponseHeader("x-go-path", h.path)
	return types.ActionContinue
}
