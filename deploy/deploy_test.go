package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/warmpath/warmpath/gateway"
)

// manifest is one decoded Kubernetes object.
type manifest struct {
	where string // file:document
	kind  string // apiVersion/kind
	obj   any    // *appsv1.Deployment, *corev1.Service, …
	meta  *metav1.ObjectMeta
}

// newObject returns an empty typed object for apiVersion/kind, or nil.
func newObject(kind string) (any, *metav1.ObjectMeta) {
	switch kind {
	case "v1/Namespace":
		o := &corev1.Namespace{}
		return o, &o.ObjectMeta
	case "v1/ConfigMap":
		o := &corev1.ConfigMap{}
		return o, &o.ObjectMeta
	case "v1/Service":
		o := &corev1.Service{}
		return o, &o.ObjectMeta
	case "apps/v1/Deployment":
		o := &appsv1.Deployment{}
		return o, &o.ObjectMeta
	case "apps/v1/StatefulSet":
		o := &appsv1.StatefulSet{}
		return o, &o.ObjectMeta
	case "policy/v1/PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		return o, &o.ObjectMeta
	}
	return nil, nil
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// decodeStrict decodes one YAML document into obj as the API server's
// strict field validation does: duplicate keys, unknown fields and fields
// in the wrong case are errors.
func decodeStrict(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return fmt.Errorf("%v", strict)
	}
	return nil
}

// loadManifests decodes every document of every YAML file in kubernetes/.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in kubernetes/: %v", err)
	}
	var out []manifest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSeparator.Split(string(b), -1) {
			where := fmt.Sprintf("%s#%d", f, i)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if tm.Kind == "" && strings.TrimSpace(stripComments(doc)) == "" {
				continue // comments only
			}
			kind := tm.APIVersion + "/" + tm.Kind
			obj, meta := newObject(kind)
			if obj == nil {
				t.Fatalf("%s: unexpected kind %s (add it to newObject)", where, kind)
			}
			if err := decodeStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %s: %v", where, kind, err)
			}
			out = append(out, manifest{where: where + " " + tm.Kind + "/" + meta.Name, kind: kind, obj: obj, meta: meta})
		}
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// find returns the one object of type T named name.
func find[T any](t *testing.T, ms []manifest, name string) *T {
	t.Helper()
	var found []*T
	for _, m := range ms {
		if o, ok := m.obj.(*T); ok && m.meta.Name == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T named %q, found %d", zero, name, len(found))
	}
	return found[0]
}

func TestDecodeIsStrict(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Service\nspec: {clusterIp: None}\n",           // wrong case
		"apiVersion: v1\nkind: Service\nspec: {clusterIP: None, ports: 1}\n", // wrong type
		"apiVersion: v1\nkind: Service\nspec: {selectors: {a: b}}\n",         // unknown
		"apiVersion: v1\nkind: Service\nmetadata: {name: a, name: b}\n",      // duplicate
	} {
		if err := decodeStrict([]byte(doc), &corev1.Service{}); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

// Every manifest decodes strictly, and every namespaced object lives in the
// namespace that enforces Pod Security "restricted".
func TestManifests(t *testing.T) {
	ms := loadManifests(t)
	ns := find[corev1.Namespace](t, ms, "inference")
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace labels %v; want pod-security.kubernetes.io/enforce=restricted", ns.Labels)
	}
	for _, m := range ms {
		if m.kind != "v1/Namespace" && m.meta.Namespace != ns.Name {
			t.Errorf("%s: namespace %q; want %q", m.where, m.meta.Namespace, ns.Name)
		}
		if d, ok := m.obj.(*appsv1.Deployment); ok {
			checkRestricted(t, m.where, d.Spec.Template.Spec)
			if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("%s: selector %v does not match the pod labels %v", m.where, d.Spec.Selector, d.Spec.Template.Labels)
			}
		}
	}
}

// checkRestricted checks a pod spec against the Pod Security Standards'
// "restricted" profile (kubernetes.io/docs/concepts/security/pod-security-standards).
func checkRestricted(t *testing.T, where string, spec corev1.PodSpec) {
	t.Helper()
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Errorf("%s: host namespaces", where)
	}
	for _, v := range spec.Volumes {
		s := v.VolumeSource
		if s.ConfigMap == nil && s.CSI == nil && s.DownwardAPI == nil && s.EmptyDir == nil && s.Ephemeral == nil &&
			s.PersistentVolumeClaim == nil && s.Projected == nil && s.Secret == nil {
			t.Errorf("%s: volume %q has a type the restricted profile forbids", where, v.Name)
		}
	}
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		t.Errorf("%s: pod runAsUser 0", where)
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		cw := where + " container " + c.Name
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", cw)
			continue
		}
		if !isTrue(sc.RunAsNonRoot) && !isTrue(psc.RunAsNonRoot) {
			t.Errorf("%s: runAsNonRoot is not true", cw)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: runAsUser 0", cw)
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil {
			seccomp = psc.SeccompProfile
		}
		if seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost) {
			t.Errorf("%s: seccompProfile %v; want RuntimeDefault", cw, seccomp)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", cw)
		}
		if isTrue(sc.Privileged) {
			t.Errorf("%s: privileged", cw)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: capabilities must drop ALL", cw)
		} else if slices.ContainsFunc(sc.Capabilities.Add, func(c corev1.Capability) bool { return c != "NET_BIND_SERVICE" }) {
			t.Errorf("%s: adds capabilities %v", cw, sc.Capabilities.Add)
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				t.Errorf("%s: hostPort %d", cw, p.HostPort)
			}
		}
	}
}

func isTrue(b *bool) bool { return b != nil && *b }

// ptrOr returns *p, or def (the API default) when p is nil.
func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// Kubernetes' preStop sleep: Service endpoints drop the pod while it
// sleeps, before SIGTERM; the gateway then runs its own drain (server.
// pre_stop, server.drain_timeout, from the ConfigMap).
const preStopSeconds = 15

func TestGatewayDeployment(t *testing.T) {
	ms := loadManifests(t)
	d := find[appsv1.Deployment](t, ms, "warmpath")
	spec := d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v; want 2 or more", d.Spec.Replicas)
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v; want maxUnavailable 0", ru)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers; want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if !isTrue(c.SecurityContext.ReadOnlyRootFilesystem) {
		t.Error("readOnlyRootFilesystem is not true")
	}
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz", c)
	checkProbe(t, "liveness", c.LivenessProbe, "/healthz", c)
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != preStopSeconds {
		t.Errorf("preStop %+v; want sleep %d s", c.Lifecycle, preStopSeconds)
	}
	sc := gatewayConfig(t, ms, d).Server
	need := int64(preStopSeconds) + int64((sc.PreStop + sc.DrainTimeout + time.Second).Seconds())
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < need {
		t.Errorf("terminationGracePeriodSeconds %d; want ≥ %d (preStop sleep + server.pre_stop + server.drain_timeout + the cut streams' second)", ptrOr(g, 30), need)
	}
	if len(spec.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints")
	}
	for _, tc := range spec.TopologySpreadConstraints {
		if sel, err := metav1.LabelSelectorAsSelector(tc.LabelSelector); err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("spread constraint on %s selects %v, not the gateway pods", tc.TopologyKey, tc.LabelSelector)
		}
	}

	pdb := find[policyv1.PodDisruptionBudget](t, ms, "warmpath")
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("PodDisruptionBudget selects %v, not the gateway pods", pdb.Spec.Selector)
	}
	if ma := pdb.Spec.MinAvailable; ma == nil || ma.IntValue() < 1 || ma.IntValue() >= int(*d.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget minAvailable %v; want 1..replicas-1", ma)
	}

	svc := find[corev1.Service](t, ms, "warmpath")
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Service selects %v, not the gateway pods", svc.Spec.Selector)
	}
	for _, p := range svc.Spec.Ports {
		if containerPort(c, p.TargetPort.String()) == 0 {
			t.Errorf("Service port %s targets %s, which the container does not expose", p.Name, p.TargetPort.String())
		}
	}

	raw, err := os.ReadFile("kubernetes/warmpath.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(c.Image, "ghcr.io/warmpath/") || !strings.Contains(string(raw), "build and push your own") {
		t.Errorf("image %q: nothing publishes warmpath images; the manifest must say to build and push your own", c.Image)
	}
}

func checkProbe(t *testing.T, what string, p *corev1.Probe, path string, c corev1.Container) {
	t.Helper()
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || containerPort(c, p.HTTPGet.Port.String()) == 0 {
		t.Errorf("%s probe %+v; want GET %s on a container port", what, p, path)
	}
}

// containerPort resolves a port name or number against c's ports; 0 means
// c does not expose it.
func containerPort(c corev1.Container, port string) int {
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
			return int(p.ContainerPort)
		}
	}
	return 0
}

// credentials must come from Secrets: the admin API's key, the salt secret
// of isolated tenants, the key sent to vLLM and the Redis password.
var credentials = []string{"WARMPATH_ADMIN_KEY", "WARMPATH_SALT_SECRET", "WARMPATH_UPSTREAM_API_KEY", "REDIS_PASSWORD"}

var secretish = regexp.MustCompile(`KEY|PASSWORD|TOKEN|SECRET`)

func TestGatewaySecrets(t *testing.T) {
	c := find[appsv1.Deployment](t, loadManifests(t), "warmpath").Spec.Template.Spec.Containers[0]
	for _, name := range credentials {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s is not set from a secretKeyRef", name)
		}
	}
	for _, e := range c.Env {
		if secretish.MatchString(e.Name) && e.Value != "" {
			t.Errorf("%s has a literal value in the manifest", e.Name)
		}
	}
}

// podEnv resolves a container's environment as the kubelet would, with
// fake Secret values and pod IP: a Secret value is "secret-<name>-<key>",
// and $(VAR) references expand against earlier variables. It returns the
// environment and the container's args expanded against it.
func podEnv(c corev1.Container) (env map[string]string, args []string) {
	env = map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	expand := func(s string) string {
		return ref.ReplaceAllStringFunc(s, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			return m // the kubelet leaves unresolved references alone
		})
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value)
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret-" + e.ValueFrom.SecretKeyRef.Name + "-" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = "10.1.2.3"
		}
	}
	for _, a := range c.Args {
		args = append(args, expand(a))
	}
	return env, args
}

// memory the gateway's configuration can hold (see the comment in
// kubernetes/warmpath.yaml): measured ~49 B a prefix-index pair, budgeted at
// 64; a cached tokenization of a 128k-token prompt, 1 MiB; 512 MiB for the
// rest.
const (
	indexBytesPerEntry = 64
	baseBytes          = 512 << 20
)

// The ConfigMap's configuration, with the Deployment's environment, passes
// warmpath config check; the memory limit and GOMEMLIMIT cover what it can
// hold.
func TestGatewayConfig(t *testing.T) {
	ms := loadManifests(t)
	d := find[appsv1.Deployment](t, ms, "warmpath")
	c := d.Spec.Template.Spec.Containers[0]
	cfg := gatewayConfig(t, ms, d)
	if err := cfg.Check(); err != nil {
		t.Fatalf("ConfigMap configuration: %v", err)
	}
	if cfg.Embedded() || cfg.Redis.URL == "" || !strings.Contains(cfg.Redis.URL, "secret-warmpath-redis-password") {
		t.Errorf("redis.url %q; want it built from the warmpath-redis Secret", cfg.Redis.URL)
	}
	if cfg.DevKey != "" || cfg.Auth.Mode != "keys" || cfg.Auth.AdminKey != "secret-warmpath-secrets-admin-key" || cfg.Auth.SaltSecret != "secret-warmpath-secrets-salt-secret" {
		t.Errorf("auth %q, admin key %q, salt secret %q, dev key %q: want tenants' keys, the admin key and salt secret from the warmpath-secrets Secret, no dev key",
			cfg.Auth.Mode, cfg.Auth.AdminKey, cfg.Auth.SaltSecret, cfg.DevKey)
	}
	if port := strings.TrimPrefix(cfg.Listen, "0.0.0.0:"); containerPort(c, port) == 0 {
		t.Errorf("listen %q: not on all interfaces at an exposed container port", cfg.Listen)
	}

	r := cfg.Routing
	if r.IndexMaxEntries == 0 || r.TokenizeCacheBytes == 0 {
		t.Fatalf("index_max_entries %d, tokenize_cache_bytes %d: set both in the ConfigMap so the memory limit can be sized from them", r.IndexMaxEntries, r.TokenizeCacheBytes)
	}
	need := int64(r.IndexMaxEntries)*indexBytesPerEntry + r.TokenizeCacheBytes + baseBytes
	limit, request := c.Resources.Limits[corev1.ResourceMemory], c.Resources.Requests[corev1.ResourceMemory]
	if limit.Cmp(request) != 0 {
		t.Errorf("memory request %s ≠ limit %s", request.String(), limit.String())
	}
	env, _ := podEnv(c)
	soft, err := goMemLimit(env["GOMEMLIMIT"])
	if err != nil {
		t.Fatalf("GOMEMLIMIT: %v", err)
	}
	if soft < need || float64(soft) > 0.9*float64(limit.Value()) {
		t.Errorf("GOMEMLIMIT %d MiB, limit %s: want %d MiB (what the configuration holds) ≤ GOMEMLIMIT ≤ 90 %% of the limit", soft>>20, limit.String(), need>>20)
	}
}

// gatewayConfig loads the configuration the Deployment's container runs
// with: the ConfigMap file its --config names, then its environment.
func gatewayConfig(t *testing.T, ms []manifest, d *appsv1.Deployment) gateway.Config {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("args %v name no --config", c.Args)
	}
	path := c.Args[i+1]
	var cmName string
	for _, vm := range c.VolumeMounts {
		if filepath.Dir(path) != vm.MountPath {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cmName = v.ConfigMap.Name
			}
		}
	}
	if cmName == "" {
		t.Fatalf("--config %s is not in a mounted ConfigMap", path)
	}
	data, ok := find[corev1.ConfigMap](t, ms, cmName).Data[filepath.Base(path)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cmName, filepath.Base(path))
	}
	file := filepath.Join(t.TempDir(), "warmpath.yaml")
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	env, _ := podEnv(c)
	cfg, err := gateway.LoadConfig(file, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", cmName, err)
	}
	return cfg
}

// goMemLimit parses a GOMEMLIMIT value (bytes with an optional B, KiB, MiB,
// GiB or TiB suffix, as the Go runtime accepts).
func goMemLimit(s string) (int64, error) {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v << u.shift, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// The vLLM Deployment serves what the gateway's discovery expects, on the
// ports its headless Service names.
func TestVLLMDeployment(t *testing.T) {
	ms := loadManifests(t)
	d := find[appsv1.Deployment](t, ms, "vllm")
	svc := find[corev1.Service](t, ms, "vllm")
	gw := find[appsv1.Deployment](t, ms, "warmpath")
	cfg := gatewayConfig(t, ms, gw)
	if len(cfg.Discovery) != 1 {
		t.Fatalf("discovery %+v; want one DNS name", cfg.Discovery)
	}
	disc := cfg.Discovery[0]

	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("vLLM Service clusterIP %q; want None (headless: one address per pod)", svc.Spec.ClusterIP)
	}
	if want := svc.Name + "." + svc.Namespace + ".svc.cluster.local"; disc.Name != want {
		t.Errorf("discovery dns %q; want the headless Service %q", disc.Name, want)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("headless Service selects %v, not the vLLM pods", svc.Spec.Selector)
	}
	c := d.Spec.Template.Spec.Containers[0]
	env, args := podEnv(c)
	if !slices.Equal(c.Command, []string{"vllm", "serve"}) {
		t.Fatalf("vLLM command %v; want [vllm serve]", c.Command)
	}
	v, err := parseVLLMServe(args)
	if err != nil {
		t.Fatalf("vLLM args: %v", err)
	}
	ports := checkVLLMServe(t, "vllm Deployment", v)
	if v.ModelID() != disc.Model {
		t.Errorf("vLLM serves %q; the gateway's discovery expects %q", v.ModelID(), disc.Model)
	}
	kc, _ := v.flag("kv-events-config")
	if want := fmt.Sprintf("kv@%s:%d@", env["POD_IP"], ports.HTTP); !strings.Contains(kc, want) {
		t.Errorf("topic in %s does not name the pod as the gateway does (%s…)", kc, want)
	}
	for _, p := range []struct {
		name       string
		vllm, disc int
	}{{"http", ports.HTTP, disc.Port}, {"kv-events", ports.KV, disc.KVPort}, {"kv-replay", ports.Replay, disc.ReplayPort}} {
		i := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == p.name })
		if i < 0 {
			t.Errorf("headless Service has no port %s", p.name)
			continue
		}
		sp := svc.Spec.Ports[i]
		if cp := containerPort(c, sp.TargetPort.String()); cp != p.vllm || int(sp.Port) != p.vllm || p.disc != p.vllm {
			t.Errorf("port %s: vLLM listens on %d, container exposes %d, Service %d, gateway discovery %d; want all equal", p.name, p.vllm, cp, sp.Port, p.disc)
		}
	}

	gwKey := secretRef(gw.Spec.Template.Spec.Containers[0], "WARMPATH_UPSTREAM_API_KEY")
	if got := secretRef(c, "VLLM_API_KEY"); got != gwKey {
		t.Errorf("vLLM's VLLM_API_KEY comes from %q, the gateway's upstream key from %q; want the same Secret key", got, gwKey)
	}
	gpus := c.Resources.Limits["nvidia.com/gpu"]
	if tp, _ := v.flag("tensor-parallel-size"); tp != "" && gpus.Cmp(resource.MustParse(tp)) != 0 {
		t.Errorf("%s GPUs for tensor-parallel-size %s", gpus.String(), tp)
	}
}

func secretRef(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	return ""
}
