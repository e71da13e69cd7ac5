package deploy

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/scd2sink/scd2sink/config"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// manifests decodes every manifest of deploy/kubernetes strictly, into
// the Kubernetes API's own types: a field the type lacks fails.
func manifests(t *testing.T) map[string]any {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	out := map[string]any{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var meta struct{ Kind string }
		if err := json.Unmarshal(js, &meta); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var obj any
		switch meta.Kind {
		case "StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "Service":
			obj = &corev1.Service{}
		case "ConfigMap":
			obj = &corev1.ConfigMap{}
		case "Secret":
			obj = &corev1.Secret{}
		case "PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "ServiceMonitor":
			obj = &monitoringv1.ServiceMonitor{}
		default:
			t.Fatalf("%s: a %q, which this test does not know", f, meta.Kind)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[meta.Kind] = obj
	}
	return out
}

// The Kubernetes deployment (deploy/kubernetes) is valid by the API's
// types, and its pieces agree: the pods mount the ConfigMap at the path
// they run with and the Secret where postgres.dsn_file reads it, the
// configuration passes run's validation, the instance id is the pod's
// name, the probes and the metrics port are http.addr's, the pods run as
// the image's non-root user, the grace period outlasts shutdown_timeout,
// and the Service, ServiceMonitor and PodDisruptionBudget select the pods.
func TestKubernetes(t *testing.T) {
	m := manifests(t)
	sts, _ := m["StatefulSet"].(*appsv1.StatefulSet)
	cm, _ := m["ConfigMap"].(*corev1.ConfigMap)
	secret, _ := m["Secret"].(*corev1.Secret)
	svc, _ := m["Service"].(*corev1.Service)
	mon, _ := m["ServiceMonitor"].(*monitoringv1.ServiceMonitor)
	pdb, _ := m["PodDisruptionBudget"].(*policyv1.PodDisruptionBudget)
	if sts == nil || cm == nil || secret == nil || svc == nil || mon == nil || pdb == nil {
		t.Fatalf("missing manifests: %v", m)
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	mountOf := func(volume string) string {
		for _, vm := range c.VolumeMounts {
			if vm.Name == volume {
				return vm.MountPath
			}
		}
		return ""
	}
	var cfgPath, dsnPath string
	for _, v := range pod.Volumes {
		switch {
		case v.ConfigMap != nil && v.ConfigMap.Name == cm.Name:
			cfgPath = filepath.Join(mountOf(v.Name), "scd2sink.yaml")
		case v.Secret != nil && v.Secret.SecretName == secret.Name:
			dsnPath = filepath.Join(mountOf(v.Name), "dsn")
		}
	}
	if strings.Join(c.Args, " ") != "run --config "+cfgPath {
		t.Errorf("the container runs %v, not with the mounted config %s", c.Args, cfgPath)
	}
	if _, ok := secret.StringData["dsn"]; !ok {
		t.Error("the Secret holds no dsn")
	}
	yml := cm.Data["scd2sink.yaml"]
	if !strings.Contains(yml, "dsn_file: "+dsnPath) {
		t.Errorf("the configuration does not read the DSN from the mounted secret %s", dsnPath)
	}
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(dsnFile, []byte(secret.StringData["dsn"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(strings.Replace(yml, dsnPath, dsnFile, 1)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("the mounted configuration does not pass validation: %v", err)
	}
	var instance bool
	for _, e := range c.Env {
		instance = instance || (e.Name == "SCD2SINK_INSTANCE_ID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name")
	}
	if !instance {
		t.Error("SCD2SINK_INSTANCE_ID is not the pod's name")
	}
	_, port, _ := net.SplitHostPort(cfg.HTTPAddr())
	if len(c.Ports) != 1 || strconv.Itoa(int(c.Ports[0].ContainerPort)) != port || !strings.HasPrefix(cfg.HTTPAddr(), "0.0.0.0:") {
		t.Errorf("container ports %v, http.addr %s", c.Ports, cfg.HTTPAddr())
	}
	for name, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != name || p.HTTPGet.Port.String() != c.Ports[0].Name {
			t.Errorf("no probe on %s at the metrics port", name)
		}
	}
	sc, csc := pod.SecurityContext, c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 10001 ||
		csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Error("the pod does not run as the image's non-root user (10001) without privilege escalation")
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || float64(*g) <= cfg.ShutdownTimeout.Seconds() {
		t.Errorf("terminationGracePeriodSeconds %v does not outlast shutdown_timeout %v", g, cfg.ShutdownTimeout)
	}
	labels := sts.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	if !selects(svc.Spec.Selector) || !selects(pdb.Spec.Selector.MatchLabels) || !selects(sts.Spec.Selector.MatchLabels) {
		t.Error("the Service, PodDisruptionBudget or StatefulSet selector misses the pods")
	}
	if sts.Spec.ServiceName != svc.Name {
		t.Errorf("the StatefulSet's serviceName %s is not the Service %s", sts.Spec.ServiceName, svc.Name)
	}
	if len(mon.Spec.Endpoints) != 1 || mon.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name || mon.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("the ServiceMonitor scrapes %+v", mon.Spec.Endpoints)
	}
	for k, v := range mon.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the Service lacks", k, v)
		}
	}
}
