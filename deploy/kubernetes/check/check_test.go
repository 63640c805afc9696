// Package check decodes the Kubernetes manifests of deploy/kubernetes strictly
// into the Kubernetes API types and checks the references between them, the
// migrate Job's own MySQL user and Secret, and what `kubectl apply -k` would
// change after an edit of a config file or a password (TestEdits), offline:
// no cluster, no network (make lint, scripts/lint-deploy.sh). It is its own
// module so that the main module does not depend on the Kubernetes
// libraries.
package check

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "write base/prometheusrule.yaml from deploy/alerts.yml")

// The Secrets the base references and leaves to the user (an overlay or the
// user's secret store provides them): the relay's passwords, mounted by the
// Deployment's pods, and the migrate Job's.
const (
	relaySecret   = "outbox-relay-credentials"
	migrateSecret = "outbox-relay-migrate-credentials"
)

// kustomizations are the directories rendered, relative to deploy/kubernetes,
// and whether the user's Secret must be among what they render.
var kustomizations = []struct {
	dir           string
	definesSecret bool
}{
	{"base", false},
	{"overlays/example", true},
}

// exampleOverlay is the overlay TestEdits edits: one that defines the Secrets.
const exampleOverlay = "overlays/example"

// object is one rendered manifest decoded into its API type.
type object struct {
	gvk schema.GroupVersionKind
	obj runtime.Object
	raw []byte
}

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme,
		policyv1.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			t.Fatalf("build the scheme: %v", err)
		}
	}
	return s
}

// render runs kustomize on dir (relative to deploy/kubernetes) and decodes
// every object strictly: a field the API type does not know fails.
func render(t *testing.T, dir string) []object {
	t.Helper()
	return renderFS(t, filesys.MakeFsOnDisk(), filepath.Join("..", dir), dir)
}

// renderFS is render of path on fsys; dir names it in messages.
func renderFS(t *testing.T, fsys filesys.FileSystem, path, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(fsys, path)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	s := newScheme(t)
	var objs []object
	for _, r := range rm.Resources() {
		raw, err := r.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s/%s as YAML: %v", dir, r.GetKind(), r.GetName(), err)
		}
		gvk := schema.FromAPIVersionAndKind(r.GetApiVersion(), r.GetKind())
		obj, err := s.New(gvk)
		if err != nil {
			t.Errorf("%s: %s %s: not a known API type (%v)", dir, gvk, r.GetName(), err)
			continue
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			t.Errorf("%s: %s %s does not decode strictly into its API type: %v", dir, gvk.Kind, r.GetName(), err)
			continue
		}
		objs = append(objs, object{gvk: gvk, obj: obj, raw: raw})
	}
	return objs
}

func TestManifests(t *testing.T) {
	for _, k := range kustomizations {
		t.Run(strings.ReplaceAll(k.dir, "/", "_"), func(t *testing.T) {
			objs := render(t, k.dir)
			if len(objs) == 0 {
				t.Fatalf("%s renders nothing", k.dir)
			}
			checkReferences(t, objs, k.definesSecret)
			checkDeployment(t, objs)
			checkConfig(t, objs)
			checkMigrateJob(t, objs)
			checkFixedNames(t, objs, baseReferences(t))
			checkRules(t, objs)
		})
	}
}

// defined lists the names of the rendered objects by kind.
func defined(objs []object) map[string]map[string]bool {
	d := map[string]map[string]bool{}
	for _, o := range objs {
		m, _ := o.obj.(metav1.Object)
		if m == nil {
			continue
		}
		if d[o.gvk.Kind] == nil {
			d[o.gvk.Kind] = map[string]bool{}
		}
		d[o.gvk.Kind][m.GetName()] = true
	}
	return d
}

// podTemplates returns the pod templates of the workloads by "Kind/name".
func podTemplates(objs []object) map[string]*corev1.PodTemplateSpec {
	p := map[string]*corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			p["Deployment/"+w.Name] = &w.Spec.Template
		case *batchv1.Job:
			p["Job/"+w.Name] = &w.Spec.Template
		}
	}
	return p
}

// checkReferences: every ConfigMap, Secret and ServiceAccount a pod uses is
// rendered (the user's Secret only where definesSecret), every selector
// selects pods, every named port exists.
func checkReferences(t *testing.T, objs []object, definesSecret bool) {
	t.Helper()
	d := defined(objs)
	need := func(where, kind, name string) {
		if d[kind][name] {
			return
		}
		if kind == "Secret" && !definesSecret && (name == relaySecret || name == migrateSecret) {
			return
		}
		t.Errorf("%s references %s %q, which is not defined", where, kind, name)
	}
	pods := podTemplates(objs)
	if len(pods) == 0 {
		t.Fatal("no workload rendered")
	}
	for where, p := range pods {
		need(where, "ServiceAccount", p.Spec.ServiceAccountName)
		for _, v := range p.Spec.Volumes {
			if v.ConfigMap != nil {
				need(where, "ConfigMap", v.ConfigMap.Name)
			}
			if v.Secret != nil {
				need(where, "Secret", v.Secret.SecretName)
			}
		}
		for _, c := range p.Spec.Containers {
			checkContainer(t, where, p, c)
			for _, e := range c.EnvFrom {
				if e.ConfigMapRef != nil {
					need(where, "ConfigMap", e.ConfigMapRef.Name)
				}
				if e.SecretRef != nil {
					need(where, "Secret", e.SecretRef.Name)
				}
			}
		}
	}
	for _, o := range objs {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			mustSelect(t, "Deployment/"+w.Name, w.Spec.Selector, []*corev1.PodTemplateSpec{&w.Spec.Template})
		case *policyv1.PodDisruptionBudget:
			mustSelect(t, "PodDisruptionBudget/"+w.Name, w.Spec.Selector, deployments(objs))
		case *corev1.Service:
			sel := &metav1.LabelSelector{MatchLabels: w.Spec.Selector}
			matched := mustSelect(t, "Service/"+w.Name, sel, deployments(objs))
			for _, sp := range w.Spec.Ports {
				if sp.TargetPort.StrVal != "" && !hasPort(matched, sp.TargetPort.StrVal) {
					t.Errorf("Service/%s targets port %q, which the pods it selects do not name", w.Name, sp.TargetPort.StrVal)
				}
			}
		case *monitoringv1.PodMonitor:
			matched := mustSelect(t, "PodMonitor/"+w.Name, &w.Spec.Selector, deployments(objs))
			for _, ep := range w.Spec.PodMetricsEndpoints {
				if ep.Port == nil || !hasPort(matched, *ep.Port) {
					t.Errorf("PodMonitor/%s scrapes a port the pods it selects do not name", w.Name)
				}
			}
		}
	}
}

func deployments(objs []object) []*corev1.PodTemplateSpec {
	var p []*corev1.PodTemplateSpec
	for _, o := range objs {
		if w, ok := o.obj.(*appsv1.Deployment); ok {
			p = append(p, &w.Spec.Template)
		}
	}
	return p
}

// mustSelect reports a selector that is empty or selects none of pods, and
// returns the pods it selects.
func mustSelect(t *testing.T, where string, ls *metav1.LabelSelector, pods []*corev1.PodTemplateSpec) []*corev1.PodTemplateSpec {
	t.Helper()
	if ls == nil || (len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0) {
		t.Errorf("%s has an empty selector: it would select every pod of the namespace", where)
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Errorf("%s: selector: %v", where, err)
		return nil
	}
	var matched []*corev1.PodTemplateSpec
	for _, p := range pods {
		if sel.Matches(labels.Set(p.Labels)) {
			matched = append(matched, p)
		}
	}
	if len(matched) == 0 {
		t.Errorf("%s selects no pod: its selector %s matches no pod template's labels", where, sel)
	}
	return matched
}

func hasPort(pods []*corev1.PodTemplateSpec, name string) bool {
	if len(pods) == 0 {
		return false
	}
	for _, p := range pods {
		found := false
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				found = found || cp.Name == name
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// checkContainer: probes use a declared port, mounts name a volume, and the
// container runs as non-root with a read-only root and no capabilities.
func checkContainer(t *testing.T, where string, p *corev1.PodTemplateSpec, c corev1.Container) {
	t.Helper()
	tp := []*corev1.PodTemplateSpec{p}
	for name, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Port.StrVal != "" && !hasPort(tp, pr.HTTPGet.Port.StrVal) {
			t.Errorf("%s: the %s probe uses port %q, which container %s does not declare", where, name, pr.HTTPGet.Port.StrVal, c.Name)
		}
	}
	vols := map[string]bool{}
	for _, v := range p.Spec.Volumes {
		vols[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if !vols[m.Name] {
			t.Errorf("%s: container %s mounts volume %q, which the pod does not define", where, c.Name, m.Name)
		}
	}
	sc, psc := c.SecurityContext, p.Spec.SecurityContext
	switch {
	case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
		t.Errorf("%s: the pod does not set runAsNonRoot", where)
	case psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: the pod's seccomp profile is not RuntimeDefault", where)
	case sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: container %s has a writable root filesystem", where, c.Name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: container %s allows privilege escalation", where, c.Name)
	case sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: container %s does not drop ALL capabilities (and add none)", where, c.Name)
	case c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero():
		t.Errorf("%s: container %s has no memory request and limit", where, c.Name)
	}
}

// checkDeployment: two replicas, probes on /healthz and /readyz, and a grace
// period longer than the relay's default --shutdown-timeout (30s).
func checkDeployment(t *testing.T, objs []object) {
	t.Helper()
	n := 0
	for _, o := range objs {
		dep, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		n++
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
			t.Errorf("Deployment/%s: fewer than 2 replicas: no standby to take over", dep.Name)
		}
		ps := dep.Spec.Template.Spec
		if ps.TerminationGracePeriodSeconds == nil || *ps.TerminationGracePeriodSeconds <= 30 {
			t.Errorf("Deployment/%s: terminationGracePeriodSeconds must exceed --shutdown-timeout (30s)", dep.Name)
		}
		for _, c := range ps.Containers {
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("Deployment/%s: container %s: liveness is not httpGet /healthz", dep.Name, c.Name)
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("Deployment/%s: container %s: readiness is not httpGet /readyz", dep.Name, c.Name)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d Deployments rendered, want 1", n)
	}
}

// configPath is where every workload's container reads its config file.
const configPath = "/etc/outbox-relay/config.yaml"

// mounted is a volume as a container mounts it.
type mounted struct {
	vol   corev1.Volume
	mount corev1.VolumeMount
}

// mountsOf maps the mount paths of container c of pod template p to what is
// mounted there.
func mountsOf(p *corev1.PodTemplateSpec, c corev1.Container) map[string]mounted {
	mounts := map[string]mounted{}
	for _, m := range c.VolumeMounts {
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name {
				mounts[m.MountPath] = mounted{vol: v, mount: m}
			}
		}
	}
	return mounts
}

// workloadConfig is the config file one container of a workload reads.
type workloadConfig struct {
	where     string // "Kind/name"
	container string
	cfg       map[string]any
	mounts    map[string]mounted
}

// configs decodes the config.yaml each workload's containers mount at
// configPath from a rendered ConfigMap; a container that mounts none, or
// one that does not decode, is reported and left out.
func configs(t *testing.T, objs []object) []workloadConfig {
	t.Helper()
	cms := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok {
			cms[cm.Name] = cm
		}
	}
	var out []workloadConfig
	for where, p := range podTemplates(objs) {
		for _, c := range p.Spec.Containers {
			mounts := mountsOf(p, c)
			v, ok := mounts[configPath]
			if !ok || v.vol.ConfigMap == nil || cms[v.vol.ConfigMap.Name] == nil {
				t.Errorf("%s: container %s does not mount a rendered ConfigMap at %s", where, c.Name, configPath)
				continue
			}
			var cfg map[string]any
			if err := yaml.UnmarshalStrict([]byte(cms[v.vol.ConfigMap.Name].Data["config.yaml"]), &cfg); err != nil {
				t.Errorf("%s: config.yaml of ConfigMap %s: %v", where, v.vol.ConfigMap.Name, err)
				continue
			}
			out = append(out, workloadConfig{where: where, container: c.Name, cfg: cfg, mounts: mounts})
		}
	}
	return out
}

// checkConfig: the config.yaml in the ConfigMap a workload mounts holds no
// flag that is refused from a file, keeps mode auto, and names files that
// the pod mounts: the passwords in a Secret's volume mounted as a directory
// (a subPath mount never sees a rotated Secret), the relay's state file in a
// writable emptyDir. The relay (the Deployment) has a MySQL and an AMQP
// password; the migrate Job a MySQL password.
func checkConfig(t *testing.T, objs []object) {
	t.Helper()
	for _, wc := range configs(t, objs) {
		where, cfg := wc.where, wc.cfg
		for _, k := range []string{"accept-lost-gtids", "force", "all"} {
			if _, ok := cfg[k]; ok {
				t.Errorf("%s: config.yaml sets %s, which the relay refuses from a file", where, k)
			}
		}
		if m, ok := cfg["mode"]; ok && m != "auto" {
			t.Errorf("%s: config.yaml sets mode %v: keep auto (it polls while a hung leader's binlog connection still holds the shared server id)", where, m)
		}
		in := func(key string, ok func(mounted) bool, what string) {
			f, _ := cfg[key].(string)
			m, found := wc.mounts[filepath.Dir(f)]
			if f == "" || !found || !ok(m) {
				t.Errorf("%s: config.yaml's %s %q is not in %s mounted by container %s", where, key, f, what, wc.container)
			}
		}
		secretDir := func(m mounted) bool { return m.vol.Secret != nil && m.mount.SubPath == "" }
		in("mysql-password-file", secretDir, "a Secret's volume (not a subPath)")
		if strings.HasPrefix(where, "Deployment/") {
			in("amqp-password-file", secretDir, "a Secret's volume (not a subPath)")
			in("state-file", func(m mounted) bool { return m.vol.EmptyDir != nil }, "an emptyDir")
		}
	}
}

// dsnParts splits a go-sql-driver DSN, user[:password]@net(addr)/dbname?params,
// into its user, its address (net(addr)) and its database.
func dsnParts(dsn string) (user, addr, db string) {
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		return "", dsn, ""
	}
	db, _, _ = strings.Cut(dsn[slash+1:], "?")
	addr = dsn[:slash]
	if at := strings.LastIndexByte(addr, '@'); at >= 0 {
		user, _, _ = strings.Cut(addr[:at], ":")
		addr = addr[at+1:]
	}
	return user, addr, db
}

// checkMigrateJob: the migrate Job logs in as a MySQL user of its own (the
// relay's cannot create tables, docs/operations.md "Grants per role"), with
// a password from a Secret the relay's pods do not mount, and migrates what
// the relay uses: the same server, database and table.
func checkMigrateJob(t *testing.T, objs []object) {
	t.Helper()
	var relay, job *workloadConfig
	all := configs(t, objs)
	for i := range all {
		switch {
		case strings.HasPrefix(all[i].where, "Deployment/"):
			relay = &all[i]
		case strings.HasPrefix(all[i].where, "Job/"):
			job = &all[i]
		}
	}
	if relay == nil || job == nil {
		t.Fatalf("want the relay's Deployment and the migrate Job, each with its config file")
	}
	str := func(wc *workloadConfig, key, def string) string {
		if v, ok := wc.cfg[key].(string); ok && v != "" {
			return v
		}
		return def
	}
	ru, raddr, rdb := dsnParts(str(relay, "mysql-dsn", ""))
	ju, jaddr, jdb := dsnParts(str(job, "mysql-dsn", ""))
	if ju == "" || ju == ru {
		t.Errorf("%s logs in to MySQL as %q, the relay's user (%s): give migrate its own user with the migrate grants", job.where, ju, relay.where)
	}
	if jaddr != raddr || jdb != rdb {
		t.Errorf("%s migrates %s/%s, the relay (%s) uses %s/%s: give both the same address and database", job.where, jaddr, jdb, relay.where, raddr, rdb)
	}
	if jt, rt := str(job, "table", "outbox"), str(relay, "table", "outbox"); jt != rt {
		t.Errorf("%s migrates table %q, the relay (%s) reads %q", job.where, jt, relay.where, rt)
	}
	secrets := func(wc *workloadConfig) map[string]bool {
		m := map[string]bool{}
		for _, v := range wc.mounts {
			if v.vol.Secret != nil {
				m[v.vol.Secret.SecretName] = true
			}
		}
		return m
	}
	relaySecrets := secrets(relay)
	for name := range secrets(job) {
		if relaySecrets[name] {
			t.Errorf("%s and %s both mount Secret %s: the migrate Job's password must be in a Secret of its own", job.where, relay.where, name)
		}
	}
}

// baseReferences returns the names of the ConfigMaps and Secrets each
// workload of the base's manifests mounts, by "Kind/name" and volume name,
// as written there (before kustomize adds any hash suffix).
func baseReferences(t *testing.T) map[string]map[string]string {
	t.Helper()
	refs := map[string]map[string]string{}
	add := func(file string, obj runtime.Object, where func() (string, *corev1.PodTemplateSpec)) {
		b, err := os.ReadFile(filepath.Join("../base", file))
		if err != nil {
			t.Fatalf("read base/%s: %v", file, err)
		}
		if err := yaml.Unmarshal(b, obj); err != nil {
			t.Fatalf("decode base/%s: %v", file, err)
		}
		name, p := where()
		refs[name] = map[string]string{}
		for _, v := range p.Spec.Volumes {
			switch {
			case v.ConfigMap != nil:
				refs[name][v.Name] = v.ConfigMap.Name
			case v.Secret != nil:
				refs[name][v.Name] = v.Secret.SecretName
			}
		}
	}
	var dep appsv1.Deployment
	add("deployment.yaml", &dep, func() (string, *corev1.PodTemplateSpec) { return "Deployment/" + dep.Name, &dep.Spec.Template })
	var job batchv1.Job
	add("migrate-job.yaml", &job, func() (string, *corev1.PodTemplateSpec) { return "Job/" + job.Name, &job.Spec.Template })
	return refs
}

// checkFixedNames: what a pod reads again while it runs (the Secrets of the
// passwords) and everything the migrate Job mounts are referenced by the
// name the base gives them, without a hash suffix. A Secret under a hashed
// name rolls the Deployment at every password change instead of reaching
// the running pods through the mounted files, and any hashed name in the
// Job's pod template makes the next edit fail to apply: a Job's template
// cannot change. (The relay's ConfigMap keeps its hash on purpose: the relay
// reads config.yaml once, at start, so a changed one must roll the pods.)
func checkFixedNames(t *testing.T, objs []object, base map[string]map[string]string) {
	t.Helper()
	for where, p := range podTemplates(objs) {
		for _, v := range p.Spec.Volumes {
			var kind, got string
			switch {
			case v.Secret != nil:
				kind, got = "Secret", v.Secret.SecretName
			case v.ConfigMap != nil && strings.HasPrefix(where, "Job/"):
				kind, got = "ConfigMap", v.ConfigMap.Name
			default:
				continue
			}
			if want, ok := base[where][v.Name]; !ok || got != want {
				t.Errorf("%s mounts %s %q as volume %s, the base names it %q: a generated one needs options.disableNameSuffixHash: true "+
					"(a hash suffix rolls the pods at every change, and in a Job's template makes the next apply fail: field is immutable)",
					where, kind, got, v.Name, want)
			}
		}
	}
}

// alertGroups reads the rule groups of deploy/alerts.yml, the one source of
// the alert rules, as plain data.
func alertGroups(t *testing.T) any {
	t.Helper()
	b, err := os.ReadFile("../../alerts.yml")
	if err != nil {
		t.Fatalf("read the alert rules: %v", err)
	}
	var f struct {
		Groups any `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("decode deploy/alerts.yml: %v", err)
	}
	return f.Groups
}

// checkRules: the PrometheusRule holds exactly the groups of deploy/alerts.yml.
func checkRules(t *testing.T, objs []object) {
	t.Helper()
	want := alertGroups(t)
	n := 0
	for _, o := range objs {
		if _, ok := o.obj.(*monitoringv1.PrometheusRule); !ok {
			continue
		}
		n++
		var got struct {
			Spec struct {
				Groups any `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(o.raw, &got); err != nil {
			t.Fatalf("decode the PrometheusRule: %v", err)
		}
		if !reflect.DeepEqual(got.Spec.Groups, want) {
			t.Errorf("the PrometheusRule's groups differ from deploy/alerts.yml: regenerate it with\n\tcd deploy/kubernetes/check && go test -run TestRulesFile -update")
		}
	}
	if n != 1 {
		t.Errorf("%d PrometheusRules rendered, want 1", n)
	}
}

// TestRulesFile writes base/prometheusrule.yaml from deploy/alerts.yml with
// -update; TestManifests checks that they agree.
func TestRulesFile(t *testing.T) {
	if !*update {
		t.Skip("writes base/prometheusrule.yaml with -update only")
	}
	groups, err := yaml.Marshal(map[string]any{"groups": alertGroups(t)})
	if err != nil {
		t.Fatalf("encode the rule groups: %v", err)
	}
	var b bytes.Buffer
	b.WriteString("# Generated from deploy/alerts.yml (the one source of the rules) by\n" +
		"#   cd deploy/kubernetes/check && go test -run TestRulesFile -update\n" +
		"# Do not edit: make lint fails when the two differ.\n" +
		"apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: outbox-relay\nspec:\n")
	for _, l := range strings.SplitAfter(strings.TrimRight(string(groups), "\n"), "\n") {
		fmt.Fprintf(&b, "  %s", l)
	}
	b.WriteString("\n")
	if err := os.WriteFile("../base/prometheusrule.yaml", b.Bytes(), 0o644); err != nil {
		t.Fatalf("write base/prometheusrule.yaml: %v", err)
	}
}

// TestEdits renders the example overlay before and after each edit a user
// makes with `kubectl apply -k` and checks what the cluster would be asked
// to change: the migrate Job's spec never (its pod template is immutable:
// a change would fail the apply), the Deployment's pod template on a
// changed config.yaml only (the relay reads it at start; a password
// reaches running pods through the mounted Secret, which keeps its name).
func TestEdits(t *testing.T) {
	before := renderEdited(t, nil)
	for _, e := range []struct {
		name, file, old, new string
		rollsRelay           bool
	}{
		{"relay config", "config.yaml", "log-format: json", "log-format: console", true},
		{"migrate config", "migrate.yaml", "log-format: json", "log-format: console", false},
		{"passwords", "kustomization.yaml", "=CHANGE-ME", "=ROTATED-2026", false},
	} {
		t.Run(strings.ReplaceAll(e.name, " ", "_"), func(t *testing.T) {
			after := renderEdited(t, func(name string, b []byte) []byte {
				if name != filepath.Join(exampleOverlay, e.file) {
					return b
				}
				if !bytes.Contains(b, []byte(e.old)) {
					t.Fatalf("%s has no %q to edit", name, e.old)
				}
				return bytes.ReplaceAll(b, []byte(e.old), []byte(e.new))
			})
			if !reflect.DeepEqual(jobSpecs(before), jobSpecs(after)) {
				t.Errorf("an edit of the %s changes the migrate Job's spec: kubectl apply would fail (field is immutable)", e.name)
			}
			rolled := !reflect.DeepEqual(relayTemplate(t, before), relayTemplate(t, after))
			switch {
			case rolled && !e.rollsRelay:
				t.Errorf("an edit of the %s changes the Deployment's pod template: it rolls the relay's pods", e.name)
			case !rolled && e.rollsRelay:
				t.Errorf("an edit of the %s leaves the Deployment's pod template as it was: the pods would keep the old config.yaml until restarted", e.name)
			}
			if e.name == "passwords" {
				for name, data := range secretData(after) {
					if reflect.DeepEqual(data, secretData(before)[name]) {
						t.Errorf("Secret %s: the edited passwords are not in it under the same name", name)
					}
				}
			}
		})
	}
}

// renderEdited renders the example overlay from an in-memory copy of
// deploy/kubernetes whose files (by path relative to it) edit rewrites.
func renderEdited(t *testing.T, edit func(name string, b []byte) []byte) []object {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		if d.IsDir() {
			if rel == "check" {
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if edit != nil {
			b = edit(rel, b)
		}
		return mem.WriteFile(filepath.Join("/k", rel), b)
	})
	if err != nil {
		t.Fatalf("copy deploy/kubernetes: %v", err)
	}
	return renderFS(t, mem, filepath.Join("/k", exampleOverlay), exampleOverlay)
}

// jobSpecs returns the rendered Jobs' specs by name.
func jobSpecs(objs []object) map[string]batchv1.JobSpec {
	m := map[string]batchv1.JobSpec{}
	for _, o := range objs {
		if j, ok := o.obj.(*batchv1.Job); ok {
			m[j.Name] = j.Spec
		}
	}
	return m
}

// relayTemplate returns the pod template of the one rendered Deployment.
func relayTemplate(t *testing.T, objs []object) corev1.PodTemplateSpec {
	t.Helper()
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.Deployment); ok {
			return d.Spec.Template
		}
	}
	t.Fatal("no Deployment rendered")
	return corev1.PodTemplateSpec{}
}

// secretData returns the rendered Secrets' data by name.
func secretData(objs []object) map[string]map[string][]byte {
	m := map[string]map[string][]byte{}
	for _, o := range objs {
		if s, ok := o.obj.(*corev1.Secret); ok {
			data := map[string][]byte{}
			for k, v := range s.Data {
				data[k] = v
			}
			for k, v := range s.StringData {
				data[k] = []byte(v)
			}
			m[s.Name] = data
		}
	}
	return m
}
