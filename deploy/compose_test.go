package deploy

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/warmpath/warmpath/gateway"
	"github.com/warmpath/warmpath/gateway/fleet"
)

// composeFile is the part of the Compose specification docker-compose.yml
// uses; decoding rejects anything else, so a misspelt key fails here
// rather than be ignored by docker compose.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Profiles    []string          `yaml:"profiles"`
	Ports       []string          `yaml:"ports"`
	NetworkMode string            `yaml:"network_mode"`
	IPC         string            `yaml:"ipc"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   []string          `yaml:"depends_on"`
	Deploy      struct {
		Resources struct {
			Reservations struct {
				Devices []struct {
					Driver       string   `yaml:"driver"`
					DeviceIDs    []string `yaml:"device_ids"`
					Capabilities []string `yaml:"capabilities"`
				} `yaml:"devices"`
			} `yaml:"reservations"`
		} `yaml:"resources"`
	} `yaml:"deploy"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return f
}

// gatewayOf returns the warmpath configuration a gateway service mounts
// (its --config file), loaded with the service's environment, after
// checking that every bind-mounted repository file exists.
func gatewayOf(t *testing.T, name string, s composeService) gateway.Config {
	t.Helper()
	i := slices.Index(s.Command, "--config")
	if len(s.Command) == 0 || s.Command[0] != "serve" || i < 0 || i+1 >= len(s.Command) {
		t.Fatalf("service %s: command %v; want serve --config FILE", name, s.Command)
	}
	var host string
	for _, v := range s.Volumes {
		src, dst, _ := strings.Cut(v, ":")
		dst, _, _ = strings.Cut(dst, ":")
		if dst == s.Command[i+1] {
			host = src
		}
	}
	if host == "" {
		t.Fatalf("service %s: --config %s is not mounted", name, s.Command[i+1])
	}
	cfg, err := gateway.LoadConfig(filepath.Join("..", host), func(k string) string { return s.Environment[k] })
	if err != nil {
		t.Fatalf("service %s: %v", name, err)
	}
	if err := cfg.Check(); err != nil {
		t.Fatalf("service %s: %s: %v", name, host, err)
	}
	return cfg
}

// TestComposeFiles checks that every repository file a service mounts
// exists, and that services depend on services that exist.
func TestComposeFiles(t *testing.T) {
	f := loadCompose(t)
	for name, s := range f.Services {
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if !strings.HasPrefix(src, "./") {
				continue // a host path such as the Hugging Face cache
			}
			if _, err := os.Stat(filepath.Join("..", src)); err != nil {
				t.Errorf("service %s mounts %s: %v", name, src, err)
			}
		}
		for _, d := range s.DependsOn {
			if _, ok := f.Services[d]; !ok {
				t.Errorf("service %s depends on %s, which does not exist", name, d)
			}
		}
		if s.Build != "" {
			if _, err := os.Stat(filepath.Join("..", s.Build, "Dockerfile")); err != nil {
				t.Errorf("service %s builds %s: %v", name, s.Build, err)
			}
		}
	}
}

// The default services: the gateway, in the simulator's network namespace,
// reaches the simulated replicas where its configuration says they are.
func TestComposeSimulated(t *testing.T) {
	f := loadCompose(t)
	sim, gw := f.Services["sim"], f.Services["warmpath"]
	if len(sim.Profiles) != 0 || len(gw.Profiles) != 0 {
		t.Fatalf("sim and warmpath must run on a plain docker compose up; profiles %v %v", sim.Profiles, gw.Profiles)
	}
	if gw.NetworkMode != "service:sim" {
		t.Fatalf("warmpath network_mode %q; the configuration's 127.0.0.1 replicas need service:sim", gw.NetworkMode)
	}
	cfg := gatewayOf(t, "warmpath", gw)
	checkPublished(t, "sim (the gateway's namespace)", sim, cfg.Listen)
	checkRedis(t, f, cfg)

	flags := simFlags(t, sim.Command)
	n, httpPort, kvPort := flags["replicas"], flags["http-port"], flags["kv-port"]
	replay := kvPort + 100 // warmpath sim's default
	if r, ok := flags["replay-port"]; ok {
		replay = r
	}
	if len(cfg.Replicas) != n {
		t.Fatalf("the configuration lists %d replicas; sim runs %d", len(cfg.Replicas), n)
	}
	for i, r := range cfg.Replicas {
		want := fleet.ReplicaSpec{
			URL:            fmt.Sprintf("http://127.0.0.1:%d", httpPort+i),
			Model:          "qwen3-32b", // warmpath sim's default --model
			KVEndpoint:     fmt.Sprintf("tcp://127.0.0.1:%d", kvPort+i),
			ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", replay+i),
		}
		if r != want {
			t.Errorf("replicas[%d] = %+v; sim serves %+v", i, r, want)
		}
	}
}

// simFlags parses `sim --flag N …` into integers.
func simFlags(t *testing.T, cmd []string) map[string]int {
	t.Helper()
	if len(cmd) == 0 || cmd[0] != "sim" || len(cmd)%2 != 1 {
		t.Fatalf("sim command %v; want sim --flag value …", cmd)
	}
	out := map[string]int{}
	for i := 1; i < len(cmd); i += 2 {
		n, err := strconv.Atoi(cmd[i+1])
		if err != nil {
			t.Fatalf("sim %s %s: %v", cmd[i], cmd[i+1], err)
		}
		out[strings.TrimPrefix(cmd[i], "--")] = n
	}
	return out
}

// The "vllm" profile: real vLLM containers on GPUs, served under the model
// id the gateway's configuration names, on the ports it dials.
func TestComposeVLLM(t *testing.T) {
	f := loadCompose(t)
	gw, ok := f.Services["warmpath-vllm"]
	if !ok || !slices.Contains(gw.Profiles, "vllm") {
		t.Fatal("no warmpath-vllm service in the vllm profile")
	}
	cfg := gatewayOf(t, "warmpath-vllm", gw)
	checkPublished(t, "warmpath-vllm", gw, cfg.Listen)
	checkRedis(t, f, cfg)
	if len(cfg.Replicas) == 0 {
		t.Fatal("the vllm profile's configuration lists no replicas")
	}
	var gpus []string
	for i, r := range cfg.Replicas {
		u, err := url.Parse(r.URL)
		if err != nil {
			t.Fatal(err)
		}
		name := u.Hostname()
		s, ok := f.Services[name]
		if !ok || !slices.Contains(s.Profiles, "vllm") || !slices.Contains(gw.DependsOn, name) {
			t.Errorf("replicas[%d] %s: no vLLM service %q in the vllm profile that warmpath-vllm depends on", i, r.URL, name)
			continue
		}
		if !strings.HasPrefix(s.Image, "vllm/vllm-openai:") || !slices.Equal(s.Entrypoint, []string{"vllm", "serve"}) {
			t.Errorf("service %s: image %q entrypoint %v; want vllm/vllm-openai and vllm serve", name, s.Image, s.Entrypoint)
		}
		v, err := parseVLLMServe(s.Command)
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		p := checkVLLMServe(t, "service "+name, v)
		if v.ModelID() != r.Model {
			t.Errorf("service %s serves %q; replicas[%d] expects %q", name, v.ModelID(), i, r.Model)
		}
		want := fleet.ReplicaSpec{
			URL:            fmt.Sprintf("http://%s:%d", name, p.HTTP),
			Model:          r.Model,
			KVEndpoint:     fmt.Sprintf("tcp://%s:%d", name, p.KV),
			ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", name, p.Replay),
		}
		if r != want {
			t.Errorf("replicas[%d] = %+v; service %s serves %+v", i, r, name, want)
		}
		devs := s.Deploy.Resources.Reservations.Devices
		if len(devs) != 1 || devs[0].Driver != "nvidia" || !slices.Contains(devs[0].Capabilities, "gpu") {
			t.Errorf("service %s: GPU reservation %+v; want one nvidia device reservation with the gpu capability", name, devs)
			continue
		}
		if tp, _ := v.flag("tensor-parallel-size"); tp != strconv.Itoa(len(devs[0].DeviceIDs)) {
			t.Errorf("service %s reserves %d GPUs for tensor-parallel-size %s", name, len(devs[0].DeviceIDs), tp)
		}
		gpus = append(gpus, devs[0].DeviceIDs...)
		if s.IPC != "host" {
			t.Errorf("service %s: ipc %q; tensor parallelism needs host IPC (or a large shm_size)", name, s.IPC)
		}
	}
	if slices.Sort(gpus); len(slices.Compact(slices.Clone(gpus))) != len(gpus) {
		t.Errorf("vLLM services share GPUs: %v", gpus)
	}
	for name, s := range f.Services {
		if s.Image != "" && strings.HasPrefix(s.Image, "vllm/") && !slices.Contains(s.Profiles, "vllm") {
			t.Errorf("service %s runs vLLM on a plain docker compose up", name)
		}
	}
}

// checkPublished checks that s publishes the gateway's listen port on all
// interfaces.
func checkPublished(t *testing.T, name string, s composeService, listen string) {
	t.Helper()
	host, port, err := net.SplitHostPort(listen)
	if err != nil || (host != "0.0.0.0" && host != "") {
		t.Errorf("listen %q: a container must listen on 0.0.0.0", listen)
	}
	for _, p := range s.Ports {
		parts := strings.Split(p, ":")
		if parts[len(parts)-1] == port {
			return
		}
	}
	t.Errorf("service %s publishes %v, not the gateway's port %s", name, s.Ports, port)
}

// checkRedis checks that cfg's Redis is a service of f.
func checkRedis(t *testing.T, f composeFile, cfg gateway.Config) {
	t.Helper()
	u, err := url.Parse(cfg.Redis.URL)
	if err != nil || u.Hostname() == "" {
		t.Fatalf("redis.url %q", cfg.Redis.URL)
	}
	s, ok := f.Services[u.Hostname()]
	if !ok || !strings.HasPrefix(s.Image, "redis:") || u.Port() != "6379" {
		t.Errorf("redis.url %q names no redis service on 6379", cfg.Redis.URL)
	}
}

// The Dockerfile is multi-stage, runs as the non-root user the Kubernetes
// manifests name, listens on every interface and exposes that port.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var stages, final [][]string // instructions, one []string{OP, args…} each
	for _, l := range strings.Split(strings.ReplaceAll(string(b), "\\\n", " "), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		f[0] = strings.ToUpper(f[0])
		if f[0] == "FROM" {
			stages = append(stages, f)
			final = nil
		}
		final = append(final, f)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages; want a build stage and a runtime stage", len(stages))
	}
	get := func(op string) []string {
		for _, f := range final {
			if f[0] == op {
				return f[1:]
			}
		}
		return nil
	}
	user := get("USER")
	if len(user) != 1 || strings.HasPrefix(user[0], "0") || strings.HasPrefix(user[0], "root") {
		t.Errorf("runtime USER %v; want a non-root numeric uid", user)
	}
	env := get("ENV")
	if len(env) != 1 || env[0] != "WARMPATH_LISTEN=0.0.0.0:8080" {
		t.Errorf("runtime ENV %v; want WARMPATH_LISTEN=0.0.0.0:8080", env)
	}
	if expose := get("EXPOSE"); !slices.Contains(expose, "8080") {
		t.Errorf("EXPOSE %v; want 8080", expose)
	}
	if len(user) != 1 {
		return
	}
	if uid, _, _ := strings.Cut(user[0], ":"); !strings.Contains(mustRead(t, "kubernetes/warmpath.yaml"), "runAsUser: "+uid) {
		t.Errorf("the gateway Deployment does not run as the image's uid %s", uid)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
