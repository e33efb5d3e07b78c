{{/*
The chart and its version, as Helm's helm.sh/chart label writes them.
*/}}
{{- define "egpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
The labels Helm adds to every object's metadata (never to selectors or pod templates, which
stay as in manifests/). Objects add their own labels from manifests/ after these.
*/}}
{{- define "egpu.labels" -}}
helm.sh/chart: {{ include "egpu.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The namespace of every namespaced object.
*/}}
{{- define "egpu.namespace" -}}
{{- required "namespace.name is required" .Values.namespace.name -}}
{{- end }}

{{/*
The egpu image (webhook, node agent): repository:tag, the tag defaulting to appVersion.
*/}}
{{- define "egpu.image" -}}
{{- $image := .Values.images.egpu -}}
{{- printf "%s:%s" $image.repository (toString ($image.tag | default .Chart.AppVersion)) -}}
{{- end }}

{{/*
The egpu-kube-scheduler image: repository:tag, the tag defaulting to appVersion.
*/}}
{{- define "egpu.schedulerImage" -}}
{{- $image := .Values.images.scheduler -}}
{{- printf "%s:%s" $image.repository (toString ($image.tag | default .Chart.AppVersion)) -}}
{{- end }}

{{/*
The egpu scheduler's kube-scheduler verbosity (--v) for its log level (egpu.logLevel).
*/}}
{{- define "egpu.schedulerVerbosity" -}}
{{- get (dict "DEBUG" "4" "INFO" "2" "WARNING" "1" "ERROR" "0") (include "egpu.logLevel" (list . "scheduler")) -}}
{{- end }}

{{/*
The egpu configuration (config.yaml of the ConfigMap egpu-config) as YAML: .Values.config, with
the PriorityClasses the chart creates added to config.priorityClasses when not named there.
*/}}
{{- define "egpu.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- if .Values.priorityClasses.create -}}
{{- $created := dict .Values.priorityClasses.online.name "high" .Values.priorityClasses.offline.name "low" -}}
{{- $_ := set $config "priorityClasses" (merge (deepCopy ($config.priorityClasses | default dict)) $created) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end }}

{{/*
The log level of one egpu part: (list $root "webhook"|"scheduler"|"nodeAgent"): its
logLevels.<part> when set, else logLevel; upper case, as Python's logging names them.
*/}}
{{- define "egpu.logLevel" -}}
{{- $root := index . 0 -}}
{{- $part := index . 1 -}}
{{- (index $root.Values.logLevels $part | default $root.Values.logLevel) | upper -}}
{{- end -}}

{{/*
A CEL test of a resource name `k`: whether the webhook reads it (egpu.io/ names, and the
config's resourceAliases, or Volcano's vgpu names when the config sets none: the aliases egpu
knows by default, egpu.contract.VOLCANO_ALIASES).
*/}}
{{- define "egpu.celEgpuResource" -}}
{{- $terms := list "k.startsWith('egpu.io/')" -}}
{{- $aliases := (.Values.config | default dict).resourceAliases -}}
{{- if $aliases -}}
{{- range $name := keys $aliases | sortAlpha -}}
{{- $terms = append $terms (printf "k == '%s'" $name) -}}
{{- end -}}
{{- else -}}
{{- $terms = append $terms "k.startsWith('volcano.sh/vgpu-')" -}}
{{- end -}}
{{- join " || " $terms -}}
{{- end }}

{{/*
The namespaces the webhook is never sent pods of: kube-system, egpu's own, and the config's
ignoredNamespaces (the webhook leaves their pods alone anyway: with failurePolicy Fail, a
webhook that is down must not refuse them either).
*/}}
{{- define "egpu.webhookSkippedNamespaces" -}}
{{- $names := list "kube-system" (include "egpu.namespace" .) -}}
{{- range (.Values.config | default dict).ignoredNamespaces | default list -}}
{{- $names = append $names . -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end }}

{{/*
Settings that render but cannot work together: fail the install or upgrade with what to do.
*/}}
{{- define "egpu.checkModes" -}}
{{- $config := .Values.config | default dict -}}
{{- $dra := or (eq ($config.allocationMode | default "extender") "dra") (has "dra" (values ($config.namespaceAllocationModes | default dict))) -}}
{{- if and $dra (not .Values.dra.enabled) -}}
{{- fail "config.allocationMode (or a config.namespaceAllocationModes value) is dra, but dra.enabled is false: the webhook then has no API access for claims, and no DeviceClass or DRA node agent exists, so every GPU pod of that mode is refused; allowed: dra.enabled=true with it, or allocation mode extender" -}}
{{- end -}}
{{- end }}
