package gateway

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/tenancy"
)

// Environment overrides. Every yaml leaf of Config has one variable, derived
// from its yaml path: WARMPATH_ + the path's keys upper-cased and joined by
// "_" (routing.session_ttl → WARMPATH_ROUTING_SESSION_TTL). envVars walks
// the Config type once to list them; applyEnv sets each one whose variable
// is set and not empty (an empty variable leaves the file's value).
//
// No field is withheld from the environment, so there is no such list:
// secrets (auth.admin_key, auth.salt_secret, redis.password, JWT keys) are
// meant to arrive that way, from a Kubernetes Secret or a compose file, as
// WARMPATH_ADMIN_KEY and WARMPATH_SALT_SECRET always did; every *_file
// field has its variable too, for secrets mounted as files.

// envPrefix starts every derived variable.
const envPrefix = "WARMPATH_"

// envAliases are the names variables had before they were derived from the
// yaml paths, by path. Each keeps working; setting an alias and the derived
// name to different values is an error naming both.
var envAliases = map[string][]string{
	"routing.policy":         {"WARMPATH_POLICY"},
	"routing.tokenize_url":   {"WARMPATH_TOKENIZE_URL"},
	"routing.tokenizer":      {"WARMPATH_TOKENIZER"},
	"routing.tokenizer_dirs": {"WARMPATH_TOKENIZER_DIRS"},
	"kv_events.topology":     {"WARMPATH_KV_TOPOLOGY"},
	"kv_events.bind":         {"WARMPATH_KV_BIND"},
	"kv_events.connect":      {"WARMPATH_KV_CONNECT"},
	"redis.master_name":      {"WARMPATH_REDIS_MASTER"},
	"auth.admin_key":         {"WARMPATH_ADMIN_KEY"},
	"auth.salt_secret":       {"WARMPATH_SALT_SECRET"},
}

// envSpecial are the exceptions to the derived formats: fields whose type
// has no natural one-line form (slices of structs) and so their own parser.
// The walker stops at these paths and does not descend into their elements.
var envSpecial = map[string]envParser{
	"replicas": {
		format: "comma-separated `url[|kv_events[|kv_replay[|data_parallel_size]]]`",
		parse:  func(v string) (any, error) { return parseReplicasEnv(v) },
	},
	"discovery": {
		format: "YAML flow sequence, e.g. `[{dns: vllm, port: 8000}]`",
		parse:  func(v string) (any, error) { return parseYAMLEnv[[]fleet.DNSSpec](v) },
	},
	"auth.jwt.keys": {
		format: "YAML flow sequence, e.g. `[{kid: k1, alg: HS256, secret_file: /s/k1}]`",
		parse:  func(v string) (any, error) { return parseYAMLEnv[[]tenancy.JWTKeyConfig](v) },
	},
}

// envReserved are WARMPATH_ variables read by the warmpath command itself,
// not by LoadConfig; no derived name or alias may take them.
var envReserved = map[string]string{
	"WARMPATH_CONFIG":           "the configuration file (`warmpath serve --config`)",
	"WARMPATH_UPSTREAM_API_KEY": "bearer token sent to replicas (vLLM `--api-key`)",
	"WARMPATH_API_KEY":          "bearer token for `warmpath bench --target`",
	"WARMPATH_URL":              "gateway base URL for `warmpath admin`",
}

// envParser parses one special variable into its field's type.
type envParser struct {
	format string
	parse  func(string) (any, error)
}

// envVar is one environment override.
type envVar struct {
	Name    string   // derived variable, e.g. WARMPATH_ROUTING_POLICY
	Path    string   // yaml path, e.g. routing.policy
	Type    string   // the value's format, for the reference page
	Aliases []string // older names, from envAliases
	index   []int    // the field's index path from Config
	special *envParser
}

// envVars lists every override, in the order of the Config struct.
func envVars() []envVar {
	var out []envVar
	walkEnv(reflect.TypeFor[Config](), nil, nil, func(v envVar) { out = append(out, v) })
	return out
}

// walkEnv visits every yaml leaf of struct type t, whose fields sit at yaml
// path and field index path index. Inline fields join their parent;
// structs that are not scalar types are walked into.
func walkEnv(t reflect.Type, path []string, index []int, visit func(envVar)) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		idx := append(slices.Clone(index), i)
		if slices.Contains(strings.Split(opts, ","), "inline") {
			walkEnv(f.Type, path, idx, visit)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // yaml's default key
		}
		p := append(slices.Clone(path), name)
		key := strings.Join(p, ".")
		if sp, ok := envSpecial[key]; ok {
			visit(envVar{Path: key, Type: sp.format, index: idx, special: &sp,
				Name: envName(p), Aliases: envAliases[key]})
			continue
		}
		if f.Type.Kind() == reflect.Struct && !isEnvScalar(f.Type) {
			walkEnv(f.Type, p, idx, visit)
			continue
		}
		visit(envVar{Path: key, Type: envType(f.Type), index: idx, Name: envName(p), Aliases: envAliases[key]})
	}
}

// envName derives a variable's name from its yaml path.
func envName(path []string) string {
	return envPrefix + strings.ToUpper(strings.Join(path, "_"))
}

var (
	durationType        = reflect.TypeFor[time.Duration]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	yamlUnmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// isEnvScalar reports whether a value of type t is read from one string:
// durations, custom text or yaml scalars, and the basic kinds.
func isEnvScalar(t reflect.Type) bool {
	if t == durationType || reflect.PointerTo(t).Implements(textUnmarshalerType) ||
		reflect.PointerTo(t).Implements(yamlUnmarshalerType) {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Float32, reflect.Float64,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// envType describes the format of a variable for a field of type t, or
// returns "" when it has none (a type the walker cannot read).
func envType(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case isEnvScalar(t):
		return t.String()
	case t.Kind() == reflect.Slice && isEnvScalar(t.Elem()):
		return "list of " + t.Elem().String() + ", comma-separated"
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String && isEnvScalar(t.Elem()):
		return "map of " + t.Elem().String() + ", `key=value` pairs, comma-separated"
	}
	return ""
}

// applyEnv sets every field whose variable (or an alias) is set, and
// returns every bad value, each naming its variable and yaml path.
func (c *Config) applyEnv(getenv func(string) string) error {
	var errs []error
	root := reflect.ValueOf(c).Elem()
	for _, ev := range envVars() {
		name, v, err := ev.lookup(getenv)
		if err == nil && v != "" {
			err = ev.set(root.FieldByIndex(ev.index), v)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("config: %s (%s): %w", name, ev.Path, err))
		}
	}
	return errors.Join(errs...)
}

// lookup returns the variable that is set among ev's name and aliases, and
// its value; two set to different values are an error.
func (ev envVar) lookup(getenv func(string) string) (name, value string, err error) {
	name = ev.Name
	for _, n := range append([]string{ev.Name}, ev.Aliases...) {
		v := getenv(n)
		switch {
		case v == "":
		case value == "":
			name, value = n, v
		case v != value:
			return name, "", fmt.Errorf("%s is also set, to a different value: set one of the two", n)
		}
	}
	return name, value, nil
}

// set parses v into the field dst.
func (ev envVar) set(dst reflect.Value, v string) error {
	if ev.special != nil {
		x, err := ev.special.parse(v)
		if err != nil {
			return err
		}
		dst.Set(reflect.ValueOf(x))
		return nil
	}
	switch t := dst.Type(); {
	case t.Kind() == reflect.Slice && !isEnvScalar(t):
		return setEnvList(dst, v)
	case t.Kind() == reflect.Map:
		return setEnvMap(dst, v)
	}
	return setEnvScalar(dst, v)
}

// setEnvScalar parses one scalar into dst: a Go duration, a custom text or
// yaml scalar, or a basic kind.
func setEnvScalar(dst reflect.Value, v string) error {
	t := dst.Type()
	switch {
	case t == durationType:
		d, err := time.ParseDuration(v)
		dst.SetInt(int64(d))
		return err
	case reflect.PointerTo(t).Implements(textUnmarshalerType):
		return dst.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(v))
	case reflect.PointerTo(t).Implements(yamlUnmarshalerType):
		return (&yaml.Node{Kind: yaml.ScalarNode, Value: v}).Decode(dst.Addr().Interface())
	}
	var err error
	switch t.Kind() {
	case reflect.String:
		dst.SetString(v)
	case reflect.Bool:
		var b bool
		b, err = strconv.ParseBool(v)
		dst.SetBool(b)
	case reflect.Float32, reflect.Float64:
		var f float64
		f, err = strconv.ParseFloat(v, t.Bits())
		dst.SetFloat(f)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var n int64
		n, err = strconv.ParseInt(v, 10, t.Bits())
		dst.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var n uint64
		n, err = strconv.ParseUint(v, 10, t.Bits())
		dst.SetUint(n)
	default:
		err = fmt.Errorf("no environment format for %s", t)
	}
	return err
}

// setEnvList parses comma-separated scalars (blanks trimmed, empty entries
// dropped) into the slice dst.
func setEnvList(dst reflect.Value, v string) error {
	items := splitList(v)
	out := reflect.MakeSlice(dst.Type(), len(items), len(items))
	for i, s := range items {
		if err := setEnvScalar(out.Index(i), s); err != nil {
			return fmt.Errorf("entry %q: %w", s, err)
		}
	}
	dst.Set(out)
	return nil
}

// setEnvMap parses comma-separated key=value pairs (as
// WARMPATH_TOKENIZER_DIRS always took them: model=dir,model=dir) into the
// map dst; neither side may be empty.
func setEnvMap(dst reflect.Value, v string) error {
	t := dst.Type()
	out := reflect.MakeMap(t)
	for _, pair := range splitList(v) {
		k, s, ok := strings.Cut(pair, "=")
		if k, s = strings.TrimSpace(k), strings.TrimSpace(s); !ok || k == "" || s == "" {
			return fmt.Errorf("%q is not key=value", pair)
		}
		val := reflect.New(t.Elem()).Elem()
		if err := setEnvScalar(val, s); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		out.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), val)
	}
	dst.Set(out)
	return nil
}

// parseReplicasEnv reads WARMPATH_REPLICAS: comma-separated entries, each
// url[|kv_events[|kv_replay[|data_parallel_size]]], e.g.
// http://10.0.0.7:8000|tcp://10.0.0.7:5557|tcp://10.0.0.7:5657|2. Empty
// fields are unset.
func parseReplicasEnv(v string) ([]fleet.ReplicaSpec, error) {
	var out []fleet.ReplicaSpec
	for _, entry := range splitList(v) {
		f := strings.Split(entry, "|")
		if len(f) > 4 {
			return nil, fmt.Errorf("entry %q has more than 4 fields (url|kv_events|kv_replay|data_parallel_size)", entry)
		}
		f = append(f, "", "", "")
		r := fleet.ReplicaSpec{URL: f[0], KVEndpoint: f[1], ReplayEndpoint: f[2]}
		if f[3] != "" {
			n, err := strconv.Atoi(f[3])
			if err != nil {
				return nil, fmt.Errorf("entry %q: data_parallel_size %q is not an integer", entry, f[3])
			}
			r.DataParallelSize = n
		}
		out = append(out, r)
	}
	return out, nil
}

// parseYAMLEnv decodes v as YAML (a flow sequence fits one line) into a T,
// refusing unknown fields as the file does.
func parseYAMLEnv[T any](v string) (T, error) {
	var x T
	dec := yaml.NewDecoder(strings.NewReader(v))
	dec.KnownFields(true)
	err := dec.Decode(&x)
	return x, err
}

// EnvReference writes the reference page of environment variables
// (docs/reference/environment.md): every variable, its yaml path, its
// format and its aliases. TestEnvironmentReference keeps the committed page
// equal to it.
func EnvReference(w io.Writer) error {
	var b bytes.Buffer
	b.WriteString(envReferenceHead)
	b.WriteString("| Variable | YAML path | Type | Aliases |\n|---|---|---|---|\n")
	for _, ev := range envVars() {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", ev.Name, ev.Path, escapeCell(ev.Type), codeList(ev.Aliases))
	}
	b.WriteString("\nRead by the `warmpath` command itself, not from the configuration:\n\n| Variable | Use |\n|---|---|\n")
	for _, n := range slices.Sorted(maps.Keys(envReserved)) {
		fmt.Fprintf(&b, "| `%s` | %s |\n", n, envReserved[n])
	}
	_, err := w.Write(b.Bytes())
	return err
}

const envReferenceHead = `# Environment variables

<!-- Generated by gateway.EnvReference; do not edit. Regenerate with
     go test ./gateway -run TestEnvironmentReference -update -->

` + "`warmpath serve`" + ` (and ` + "`warmpath config check`" + `) reads the YAML file and then
these variables; a variable that is set and not empty replaces the file's
value. Every field of the file has one: ` + "`WARMPATH_`" + ` and its yaml path,
upper-cased, with ` + "`_`" + ` between the keys (` + "`routing.session_ttl`" + ` →
` + "`WARMPATH_ROUTING_SESSION_TTL`" + `). Durations take Go's syntax (` + "`250ms`" + `,
` + "`1m30s`" + `), booleans ` + "`true`/`false`" + `, lists comma-separated values and maps
comma-separated ` + "`key=value`" + ` pairs. An alias is a variable's older name: it
still works, and setting it and the variable to different values is an
error. A bad value fails the start with an error naming the variable and
the path.

`

// escapeCell makes s safe inside a Markdown table cell.
func escapeCell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// codeList formats names as comma-separated code spans.
func codeList(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "`" + n + "`"
	}
	return strings.Join(out, ", ")
}
