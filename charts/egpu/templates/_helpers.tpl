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
The egpu image (webhook, extender, node agent): repository:tag, the tag defaulting to appVersion.
*/}}
{{- define "egpu.image" -}}
{{- $image := .Values.images.egpu -}}
{{- printf "%s:%s" $image.repository (toString ($image.tag | default .Chart.AppVersion)) -}}
{{- end }}

{{/*
The kube-scheduler image.
*/}}
{{- define "egpu.kubeSchedulerImage" -}}
{{- $image := .Values.images.kubeScheduler -}}
{{- printf "%s:%s" $image.repository (toString $image.tag) -}}
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
The log level of one egpu part: (list $root "webhook"|"extender"|"nodeAgent"): its
logLevels.<part> when set, else logLevel; upper case, as Python's logging names them.
*/}}
{{- define "egpu.logLevel" -}}
{{- $root := index . 0 -}}
{{- $part := index . 1 -}}
{{- (index $root.Values.logLevels $part | default $root.Values.logLevel) | upper -}}
{{- end -}}
