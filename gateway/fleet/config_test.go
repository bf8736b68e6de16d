package fleet

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/scoring"
)

var validationTests = []struct {
	name    string
	cfg     Config
	wantErr string // substring; "" = valid
}{
	{"empty", Config{}, "fleet: config: no replicas"},
	{"valid static", Config{Replicas: []ReplicaSpec{{URL: "http://10.0.0.7:8000"}}}, ""},
	{"valid dns", Config{Discovery: []DNSSpec{{Name: "vllm.ns.svc", Port: 8000}}}, ""},
	{
		"bad scheme",
		Config{Replicas: []ReplicaSpec{{URL: "http://a:1"}, {URL: "http://b:1"}, {URL: "ftp://c:1"}}},
		"fleet: replicas[2].url: ",
	},
	{"no scheme", Config{Replicas: []ReplicaSpec{{URL: "10.0.0.7:8000"}}}, "fleet: replicas[0].url: "},
	{"no host", Config{Replicas: []ReplicaSpec{{URL: "http://:8000"}}}, "fleet: replicas[0].url: \"http://:8000\": missing host"},
	{"v1 suffix", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000/v1/"}}}, "fleet: replicas[0].url: \"http://a:8000/v1/\": give the base URL without /v1"},
	{"query", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000?x=1"}}}, "fleet: replicas[0].url: "},
	{"port range", Config{Replicas: []ReplicaSpec{{URL: "http://a:70000"}}}, "fleet: replicas[0].url: "},
	{
		"duplicate default names",
		Config{Replicas: []ReplicaSpec{{URL: "http://a:8000"}, {URL: "http://a:8000/"}}},
		`fleet: replicas[1].name: duplicate "a:8000" (also replicas[0])`,
	},
	{
		"duplicate explicit names",
		Config{Replicas: []ReplicaSpec{{Name: "x", URL: "http://a:8000"}, {Name: "x", URL: "http://b:8000"}}},
		`fleet: replicas[1].name: duplicate "x"`,
	},
	{"name with space", Config{Replicas: []ReplicaSpec{{Name: "a b", URL: "http://a:8000"}}}, "fleet: replicas[0].name: "},
	{"kv bind address", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000", KVEndpoint: "tcp://*:5557"}}}, "fleet: replicas[0].kv_events: "},
	{"kv no port", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000", KVEndpoint: "tcp://a"}}}, "fleet: replicas[0].kv_events: "},
	{"kv scheme", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000", KVEndpoint: "udp://a:1"}}}, "fleet: replicas[0].kv_events: "},
	{"replay bad", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000", KVEndpoint: "tcp://a:1", ReplayEndpoint: "tcp://a:x"}}}, "fleet: replicas[0].kv_replay: "},
	{"ipc with dp", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000", KVEndpoint: "ipc:///tmp/kv", DataParallelSize: 2}}}, "fleet: replicas[0].kv_events: "},
	{"dp negative", Config{Replicas: []ReplicaSpec{{URL: "http://a:8000", DataParallelSize: -1}}}, "fleet: replicas[0].data_parallel_size: "},
	{"dns empty name", Config{Discovery: []DNSSpec{{Name: "a", Port: 1}, {Port: 8000}}}, "fleet: discovery[1].dns: empty"},
	{"dns name with port", Config{Discovery: []DNSSpec{{Name: "a:8000", Port: 8000}}}, "fleet: discovery[0].dns: "},
	{"dns no port", Config{Discovery: []DNSSpec{{Name: "a"}}}, "fleet: discovery[0].port: 0 out of range"},
	{"dns port range", Config{Discovery: []DNSSpec{{Name: "a", Port: 65536}}}, "fleet: discovery[0].port: "},
	{"dns kv port", Config{Discovery: []DNSSpec{{Name: "a", Port: 1, KVPort: -1}}}, "fleet: discovery[0].kv_port: "},
	{"dns replay port", Config{Discovery: []DNSSpec{{Name: "a", Port: 1, KVPort: 2, ReplayPort: 70000}}}, "fleet: discovery[0].replay_port: "},
	{"dns dp ports overlap", Config{Discovery: []DNSSpec{{Name: "a", Port: 1, KVPort: 5557, ReplayPort: 5558, DataParallelSize: 2}}}, "fleet: discovery[0].replay_port: 5558 overlaps"},
	{"static dp ports overlap", Config{Replicas: []ReplicaSpec{{URL: "http://a:1", KVEndpoint: "tcp://a:5557", ReplayEndpoint: "tcp://a:5558", DataParallelSize: 2}}}, "fleet: replicas[0].kv_replay: "},
	{"dns scheme", Config{Discovery: []DNSSpec{{Name: "a", Port: 1, Scheme: "grpc"}}}, "fleet: discovery[0].scheme: "},
	{"dns interval", Config{Discovery: []DNSSpec{{Name: "a", Port: 1, Interval: -time.Second}}}, "fleet: discovery[0].interval: "},
	{"negative health interval", Config{Replicas: []ReplicaSpec{{URL: "http://a:1"}}, Health: HealthConfig{Interval: -1}}, "fleet: healthInterval: "},
	{"negative threshold", Config{Replicas: []ReplicaSpec{{URL: "http://a:1"}}, Health: HealthConfig{Failures: -1}}, "fleet: failureThreshold: "},
}

func TestNewValidation(t *testing.T) {
	for _, tt := range validationTests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := New(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v; want no error", err)
				}
				if f.Snapshot() == nil {
					t.Fatal("Snapshot() = nil")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New: error %v; want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// HealthConfig's own defaults are the ones New fills, a set field is
// kept, and Validate names each negative field by its yaml path.
func TestHealthConfig(t *testing.T) {
	want := HealthConfig{Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout, Failures: DefaultFailureThreshold,
		ScrapeInterval: DefaultScrapeInterval, StaleAfter: DefaultStaleAfter}
	if got := (HealthConfig{}).WithDefaults(); got != want {
		t.Errorf("WithDefaults() = %+v; want %+v", got, want)
	}
	if got := (HealthConfig{Failures: 7}).WithDefaults().Failures; got != 7 {
		t.Errorf("WithDefaults kept failures %d; want 7", got)
	}
	errs := HealthConfig{Interval: -1, Timeout: -1, Failures: -1, ScrapeInterval: -1, StaleAfter: -1}.Validate()
	var got []string
	for _, err := range errs {
		got = append(got, err.Error())
	}
	for _, field := range []string{"health.interval", "health.timeout", "health.failures", "health.scrape_interval", "health.stale_after"} {
		if !strings.Contains(strings.Join(got, "\n"), "config: "+field+":") {
			t.Errorf("Validate() = %q; want an error naming %s", got, field)
		}
	}
	if errs := want.Validate(); errs != nil {
		t.Errorf("defaults: Validate() = %v; want none", errs)
	}
}

func TestNewDefaults(t *testing.T) {
	f, err := New(Config{Replicas: []ReplicaSpec{
		{URL: "http://10.0.0.7:8000/"},
		{URL: "https://vllm.example", Model: "m"},
		{Name: "custom", URL: "http://[fd00::1]:8000/prefix/"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := f.cfg
	health := HealthConfig{Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout, Failures: DefaultFailureThreshold,
		ScrapeInterval: DefaultScrapeInterval, StaleAfter: DefaultStaleAfter}
	if c.Health != health || c.RecoveryThreshold != DefaultRecoveryThreshold ||
		c.ScrapeTimeout != DefaultStaleAfter || c.ModelsInterval != DefaultModelsInterval {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.Saturation != (scoring.Saturation{MaxWaiting: 32, MaxKVUsage: 1.0, MaxInflightPrefillTokens: 262144}) {
		t.Errorf("saturation defaults = %+v", c.Saturation)
	}
	if c.Client == nil || c.Resolver == nil || c.Now == nil || c.Logger == nil {
		t.Error("nil dependency not defaulted")
	}
	var got [][2]string
	for _, r := range f.Snapshot().Replicas {
		got = append(got, [2]string{r.Spec.Name, r.Spec.URL})
	}
	want := [][2]string{
		{"10.0.0.7:8000", "http://10.0.0.7:8000"},
		{"custom", "http://[fd00::1]:8000/prefix"},
		{"vllm.example:443", "https://vllm.example"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("replicas = %v; want %v (sorted by name)", got, want)
	}
	if m := f.Replica("vllm.example:443").State().Models; !slices.Equal(m, []string{"m"}) {
		t.Errorf("configured model: Models = %v; want [m]", m)
	}
	if s := f.Replica("custom").State(); s.Healthy || s.HealthReason != reasonPending || s.Models != nil {
		t.Errorf("initial state = %+v; want pending, no models", s)
	}

	fd, err := New(Config{Discovery: []DNSSpec{{Name: "a", Port: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := fd.cfg.Discovery[0]; d.Scheme != "http" || d.Interval != DefaultDNSInterval {
		t.Errorf("dns defaults = %+v", d)
	}
}

func TestKVSources(t *testing.T) {
	tests := []struct {
		spec ReplicaSpec
		want []KVSource
	}{
		{ReplicaSpec{}, nil},
		{
			ReplicaSpec{KVEndpoint: "tcp://10.0.0.7:5557", ReplayEndpoint: "tcp://10.0.0.7:5600"},
			[]KVSource{{0, "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5600"}},
		},
		{
			ReplicaSpec{KVEndpoint: "tcp://[fd00::1]:5557", ReplayEndpoint: "tcp://[fd00::1]:5600", DataParallelSize: 3},
			[]KVSource{
				{0, "tcp://[fd00::1]:5557", "tcp://[fd00::1]:5600"},
				{1, "tcp://[fd00::1]:5558", "tcp://[fd00::1]:5601"},
				{2, "tcp://[fd00::1]:5559", "tcp://[fd00::1]:5602"},
			},
		},
		{
			ReplicaSpec{KVEndpoint: "inproc://kv", DataParallelSize: 2},
			[]KVSource{{0, "inproc://kv", ""}, {1, "inproc://kv_dp1", ""}},
		},
	}
	for _, tt := range tests {
		if got := tt.spec.KVSources(); !slices.Equal(got, tt.want) {
			t.Errorf("%+v.KVSources() = %v; want %v", tt.spec, got, tt.want)
		}
	}
}

func TestDNSSpecFor(t *testing.T) {
	d := DNSSpec{Name: "vllm", Port: 8000, Scheme: "https", KVPort: 5557, ReplayPort: 5600, Model: "m", DataParallelSize: 2}
	got := d.specFor("fd00::7")
	want := ReplicaSpec{
		Name: "[fd00::7]:8000", URL: "https://[fd00::7]:8000", Model: "m",
		KVEndpoint: "tcp://[fd00::7]:5557", ReplayEndpoint: "tcp://[fd00::7]:5600", DataParallelSize: 2,
	}
	if got != want {
		t.Errorf("specFor = %+v; want %+v", got, want)
	}
	if got := (DNSSpec{Name: "vllm", Port: 8000, Scheme: "http"}).specFor("10.1.2.3"); got.KVEndpoint != "" || got.ReplayEndpoint != "" {
		t.Errorf("no KV port: spec = %+v; want no KV endpoints", got)
	}
}
