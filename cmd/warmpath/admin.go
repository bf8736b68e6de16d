package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

const adminUsage = `usage: warmpath admin [--url URL] [--admin-key KEY] <command> [flags]

commands:
  tenants create --id ID [--name N] [--isolated] [--weight W] [--rpm N] [--tpm N] [--concurrent N]
                 [--default-class C] [--class-ceiling C] [--models a,b*] [--break-excerpts]
  tenants list
  tenants get    --id ID
  tenants update --id ID [the create flags; only those given change; --models= allows all] [--disabled=true|false]
  keys issue     --tenant ID [--name N] [--expires-in 720h] [--models a,b] [--rpm N] [--tpm N] [--concurrent N] [--class-ceiling C]
  keys list      --tenant ID
  keys revoke    --tenant ID --key KEYID
  keys rotate    --tenant ID --key KEYID [--grace 1h]
  usage          --tenant ID [--key KEYID] [--from RFC3339] [--to RFC3339] [--step 1h]
  prefix-breaks  --tenant ID   (where the tenant's turns break their prefix, with hints; one gateway's view)
`

// runAdmin drives the admin API of a running gateway.
func runAdmin(ctx context.Context, args []string) error {
	return adminMain(ctx, args, os.Stdout, os.Getenv)
}

func adminMain(ctx context.Context, args []string, out io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), adminUsage) }
	base := fs.String("url", or(getenv("WARMPATH_URL"), "http://127.0.0.1:8080"), "gateway base URL (env WARMPATH_URL)")
	key := fs.String("admin-key", getenv("WARMPATH_ADMIN_KEY"), "admin key (env WARMPATH_ADMIN_KEY)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *key == "" {
		return errors.New("--admin-key or WARMPATH_ADMIN_KEY is required")
	}
	c := &adminCLI{base: strings.TrimRight(*base, "/"), key: *key, out: out, http: &http.Client{Timeout: 30 * time.Second}}
	return c.dispatch(ctx, fs.Args())
}

func or(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

type adminCLI struct {
	base, key string
	out       io.Writer
	http      *http.Client
}

func (c *adminCLI) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("no command; see warmpath admin -h")
	}
	cmd := args[0]
	if len(args) > 1 && cmd != "usage" && cmd != "prefix-breaks" {
		cmd += " " + args[1]
		args = args[1:]
	}
	fs := flag.NewFlagSet("admin "+cmd, flag.ContinueOnError)
	f := addAdminFlags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	t, k := url.PathEscape(f.tenant), url.PathEscape(f.key)
	switch cmd {
	case "tenants create":
		return c.call(ctx, "POST", "/admin/tenants", f.tenantBody(set, nil))
	case "tenants list":
		return c.call(ctx, "GET", "/admin/tenants", nil)
	case "tenants get":
		return c.call(ctx, "GET", "/admin/tenants/"+url.PathEscape(f.id), nil)
	case "tenants update":
		return c.update(ctx, f, set)
	case "keys issue":
		return c.call(ctx, "POST", "/admin/tenants/"+t+"/keys", f.keyBody(set))
	case "keys list":
		return c.call(ctx, "GET", "/admin/tenants/"+t+"/keys", nil)
	case "keys revoke":
		return c.call(ctx, "POST", "/admin/tenants/"+t+"/keys/"+k+"/revoke", nil)
	case "keys rotate":
		return c.call(ctx, "POST", "/admin/tenants/"+t+"/keys/"+k+"/rotate", map[string]string{"grace": f.grace})
	case "usage":
		q := url.Values{}
		for name, v := range map[string]string{"key": f.key, "from": f.from, "to": f.to, "step": f.step} {
			if v != "" {
				q.Set(name, v)
			}
		}
		return c.call(ctx, "GET", "/admin/tenants/"+t+"/usage?"+q.Encode(), nil)
	case "prefix-breaks":
		return c.call(ctx, "GET", "/admin/tenants/"+t+"/prefix-breaks", nil)
	}
	return fmt.Errorf("unknown command %q; see warmpath admin -h", cmd)
}

// adminFlags are every subcommand's flags; each uses the ones it needs.
type adminFlags struct {
	id, name, tenant, key, models, defClass, ceiling, expiresIn, grace, from, to, step string
	isolated, disabled, excerpts                                                       bool
	weight, rpm, tpm, concurrent                                                       int
}

func addAdminFlags(fs *flag.FlagSet) *adminFlags {
	f := &adminFlags{}
	for _, s := range []struct {
		p          *string
		name, help string
	}{
		{&f.id, "id", "tenant id"}, {&f.name, "name", "display name"}, {&f.tenant, "tenant", "tenant id"},
		{&f.key, "key", "key id"}, {&f.models, "models", "comma-separated allow-list; empty allows every model"},
		{&f.defClass, "default-class", "interactive or background"}, {&f.ceiling, "class-ceiling", "interactive or background"},
		{&f.expiresIn, "expires-in", "key lifetime, e.g. 720h"}, {&f.grace, "grace", "how long the old key keeps working"},
		{&f.from, "from", "RFC 3339 start"}, {&f.to, "to", "RFC 3339 end"}, {&f.step, "step", "bucket size, e.g. 1h"},
	} {
		fs.StringVar(s.p, s.name, "", s.help)
	}
	fs.BoolVar(&f.isolated, "isolated", false, "own cache salt (no prefix sharing with other tenants)")
	fs.BoolVar(&f.disabled, "disabled", false, "refuse every credential of the tenant")
	fs.BoolVar(&f.excerpts, "break-excerpts", false, "keep text excerpts around the tenant's prefix breaks (prefix-breaks)")
	for _, i := range []struct {
		p          *int
		name, help string
	}{{&f.weight, "weight", "fair-share weight"}, {&f.rpm, "rpm", "requests per minute"},
		{&f.tpm, "tpm", "tokens per minute"}, {&f.concurrent, "concurrent", "concurrent requests"}} {
		fs.IntVar(i.p, i.name, 0, i.help)
	}
	return f
}

func (f *adminFlags) modelList() any {
	if f.models == "" {
		return nil
	}
	return strings.Split(f.models, ",")
}

// tenantBody builds a create or patch body from the flags given; limits
// start from cur (the stored limits, for a patch).
func (f *adminFlags) tenantBody(set map[string]bool, cur map[string]any) map[string]any {
	b := map[string]any{}
	put := func(flag, field string, v any) {
		if set[flag] {
			b[field] = v
		}
	}
	put("id", "id", f.id)
	put("name", "name", f.name)
	put("isolated", "isolated", f.isolated)
	put("disabled", "disabled", f.disabled)
	put("break-excerpts", "break_excerpts", f.excerpts)
	put("weight", "weight", f.weight)
	put("default-class", "default_class", f.defClass)
	put("class-ceiling", "class_ceiling", f.ceiling)
	put("models", "models", f.modelList())
	if l := f.limits(set, cur); l != nil {
		b["limits"] = l
	}
	return b
}

func (f *adminFlags) limits(set map[string]bool, cur map[string]any) map[string]any {
	if !set["rpm"] && !set["tpm"] && !set["concurrent"] {
		return nil
	}
	l := map[string]any{}
	for k, v := range cur {
		l[k] = v
	}
	for flag, field := range map[string]string{"rpm": "requests_per_minute", "tpm": "tokens_per_minute", "concurrent": "concurrent"} {
		if set[flag] {
			l[field] = map[string]int{"rpm": f.rpm, "tpm": f.tpm, "concurrent": f.concurrent}[flag]
		}
	}
	return l
}

func (f *adminFlags) keyBody(set map[string]bool) map[string]any {
	b := map[string]any{}
	if set["name"] {
		b["name"] = f.name
	}
	if set["expires-in"] {
		b["expires_in"] = f.expiresIn
	}
	if set["models"] {
		b["models"] = f.modelList()
	}
	if set["class-ceiling"] {
		b["class_ceiling"] = f.ceiling
	}
	if l := f.limits(set, nil); l != nil {
		b["limits"] = l
	}
	return b
}

// update patches a tenant; a limit flag keeps the other stored limits.
func (c *adminCLI) update(ctx context.Context, f *adminFlags, set map[string]bool) error {
	path := "/admin/tenants/" + url.PathEscape(f.id)
	var cur struct {
		Limits map[string]any `json:"limits"`
	}
	if f.limits(set, nil) != nil {
		b, err := c.send(ctx, "GET", path, nil)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &cur); err != nil {
			return fmt.Errorf("decode tenant: %w", err)
		}
	}
	delete(set, "id")
	return c.call(ctx, "PATCH", path, f.tenantBody(set, cur.Limits))
}

// call sends one request and prints the indented JSON answer.
func (c *adminCLI) call(ctx context.Context, method, path string, body any) error {
	b, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if json.Indent(&buf, b, "", "  ") != nil {
		buf.Write(b)
	}
	_, err = fmt.Fprintln(c.out, strings.TrimSpace(buf.String()))
	return err
}

func (c *adminCLI) send(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		var env struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if json.Unmarshal(b, &env) == nil && env.Error.Message != "" {
			return nil, fmt.Errorf("%s %s: %d %s (%s)", method, path, resp.StatusCode, env.Error.Message, env.Error.Code)
		}
		return nil, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return b, nil
}
