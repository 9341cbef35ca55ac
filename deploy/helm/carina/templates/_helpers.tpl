{{/*
Labels on every object: the component's name (also the selector of its
pods, unchanged from the earlier plain manifests so `kubectl apply` and
`helm upgrade` can take over their Deployments and DaemonSets), the
application and its version.
*/}}
{{- define "carina.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: carina
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end }}

{{- define "carina.selector" -}}
app.kubernetes.io/name: {{ . }}
{{- end }}

{{/* A Carina image: the override if set, else <image.repository>/<name>:<tag>. */}}
{{- define "carina.image" -}}
{{- if .override -}}
{{ .override }}
{{- else -}}
{{ .root.Values.image.repository }}/{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The strategy flag's value: Carina's documented spelling "spradout" is spreadout. */}}
{{- define "carina.strategy" -}}
{{- $s := .Values.config.schedulerStrategy | default "spreadout" | lower -}}
{{- if eq $s "spradout" }}spreadout{{ else }}{{ $s }}{{ end -}}
{{- end }}

{{/*
The kubelet directory without a trailing slash. Go Carina's values name it
node.kubelet: that key is read as kubeletDir, and refused when kubeletDir
names another directory than its default.
*/}}
{{- define "carina.kubeletDir" -}}
{{- $dir := .Values.kubeletDir | trimSuffix "/" -}}
{{- with .Values.node.kubelet -}}
{{- $go := . | trimSuffix "/" -}}
{{- if and (ne $dir "/var/lib/kubelet") (ne $dir $go) -}}
{{- fail (printf "node.kubelet (Go Carina's name of kubeletDir) is %q and kubeletDir is %q: give only kubeletDir" $go $dir) -}}
{{- end -}}
{{- $dir = $go -}}
{{- end -}}
{{- $dir -}}
{{- end }}

{{/* The issuer's URL as the nodes reach it (the Service's DNS name). */}}
{{- define "carina.issuerURL" -}}
https://carina-controller.{{ .Release.Namespace }}.svc:{{ .Values.identity.port }}
{{- end }}

{{/*
The container security context of the unprivileged containers: a fixed
non-root user, nothing to escalate to, no capabilities, a read-only root.
*/}}
{{- define "carina.restrictedContainer" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{- define "carina.restrictedPod" -}}
runAsNonRoot: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Prefer spreading the replicas of a component over nodes. */}}
{{- define "carina.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "carina.selector" . | nindent 12 }}
{{- end }}

{{/*
The directories of the HOST groups of `config` and node.extraHostPaths,
one per line, without duplicates: the node mounts each at the same path.
*/}}
{{- define "carina.hostPaths" -}}
{{- $paths := list -}}
{{- range .Values.config.diskSelector -}}
{{- if and (kindIs "map" .) (eq (upper (toString .policy)) "HOST") -}}
{{- $root := .root | default (first (.re | default (list ""))) -}}
{{- if $root }}{{ $paths = append $paths $root }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range .Values.node.extraHostPaths }}{{ $paths = append $paths . }}{{ end -}}
{{- range uniq $paths }}
{{ . }}
{{- end -}}
{{- end }}

{{/* The NetworkPolicy ingress rule of a /metrics port (nothing without
metrics): from metrics.from, or from anywhere when that is empty. */}}
{{- define "carina.metricsIngress" -}}
{{- if .root.Values.metrics.enabled -}}
# /metrics, for Prometheus.
- ports:
    - port: {{ .port }}
      protocol: TCP
  {{- with .root.Values.metrics.from }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
The environment that names a Carina container's OpenTelemetry resource by
the semantic conventions' k8s.* attributes (its pod, namespace and node),
from the downward API. Rendered before the user's env, so a value of
OTEL_RESOURCE_ATTRIBUTES there replaces it.
*/}}
{{- define "carina.otelResourceEnv" -}}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_NAMESPACE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: OTEL_RESOURCE_ATTRIBUTES
  value: k8s.pod.name=$(K8S_POD_NAME),k8s.namespace.name=$(K8S_NAMESPACE_NAME),k8s.node.name=$(K8S_NODE_NAME)
{{- end }}

{{/*
"true" when the pod webhook is on (podWebhook.enabled or the
goCarinaCompat preset), empty otherwise; it needs the issuer (identity.mode
issued), whose port and certificate it is served with.
*/}}
{{- define "carina.podWebhook" -}}
{{- if or .Values.podWebhook.enabled .Values.goCarinaCompat -}}
{{- if ne .Values.identity.mode "issued" -}}
{{- fail "podWebhook (or goCarinaCompat) needs identity.mode issued: the webhook is served on the issuer's port with its certificate" -}}
{{- end -}}
true
{{- end -}}
{{- end }}
