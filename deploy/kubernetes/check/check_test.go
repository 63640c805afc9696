// Package check decodes the Kubernetes manifests of deploy/kubernetes strictly
// into the Kubernetes API types and checks the references between them,
// offline: no cluster, no network (make lint, scripts/lint-deploy.sh). It is
// its own module so that the main module does not depend on the Kubernetes
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

// userSecret is the Secret the base references and leaves to the user (an
// overlay or the user's secret store provides it).
const userSecret = "outbox-relay-credentials"

// kustomizations are the directories rendered, relative to deploy/kubernetes,
// and whether the user's Secret must be among what they render.
var kustomizations = []struct {
	dir           string
	definesSecret bool
}{
	{"base", false},
	{"overlays/example", true},
}

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
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join("..", dir))
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
		if kind == "Secret" && !definesSecret && name == userSecret {
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

// checkConfig: the relay's config.yaml in the ConfigMap a workload mounts
// holds no flag that is refused from a file, keeps mode auto, and names files
// that the pod mounts: the passwords in the Secret's volume, the state file in
// a writable emptyDir.
func checkConfig(t *testing.T, objs []object) {
	t.Helper()
	cms := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok {
			cms[cm.Name] = cm
		}
	}
	for where, p := range podTemplates(objs) {
		for _, c := range p.Spec.Containers {
			mounts := map[string]corev1.Volume{} // mount path -> volume
			for _, m := range c.VolumeMounts {
				for _, v := range p.Spec.Volumes {
					if v.Name == m.Name {
						mounts[m.MountPath] = v
					}
				}
			}
			v, ok := mounts["/etc/outbox-relay/config.yaml"]
			if !ok || v.ConfigMap == nil || cms[v.ConfigMap.Name] == nil {
				t.Errorf("%s: container %s does not mount a rendered ConfigMap at /etc/outbox-relay/config.yaml", where, c.Name)
				continue
			}
			var cfg map[string]any
			if err := yaml.UnmarshalStrict([]byte(cms[v.ConfigMap.Name].Data["config.yaml"]), &cfg); err != nil {
				t.Errorf("%s: config.yaml of ConfigMap %s: %v", where, v.ConfigMap.Name, err)
				continue
			}
			for _, k := range []string{"accept-lost-gtids", "force", "all"} {
				if _, ok := cfg[k]; ok {
					t.Errorf("%s: config.yaml sets %s, which the relay refuses from a file", where, k)
				}
			}
			if m, ok := cfg["mode"]; ok && m != "auto" {
				t.Errorf("%s: config.yaml sets mode %v: keep auto (it polls while a hung leader's binlog connection still holds the shared server id)", where, m)
			}
			in := func(key string, ok func(corev1.Volume) bool, what string) {
				f, _ := cfg[key].(string)
				v, found := mounts[filepath.Dir(f)]
				if f == "" || !found || !ok(v) {
					t.Errorf("%s: config.yaml's %s %q is not in %s mounted by container %s", where, key, f, what, c.Name)
				}
			}
			in("mysql-password-file", func(v corev1.Volume) bool { return v.Secret != nil }, "a Secret")
			in("amqp-password-file", func(v corev1.Volume) bool { return v.Secret != nil }, "a Secret")
			if strings.HasPrefix(where, "Deployment/") {
				in("state-file", func(v corev1.Volume) bool { return v.EmptyDir != nil }, "an emptyDir")
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
