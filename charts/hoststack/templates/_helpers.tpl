{{/* Common labels of every object of the release. */}}
{{- define "hoststack.labels" -}}
app.kubernetes.io/name: hoststack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The image reference, tag defaulting to the chart's appVersion. */}}
{{- define "hoststack.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The image the operator gives the agent DaemonSet. */}}
{{- define "hoststack.agentImage" -}}
{{ .Values.operator.agentImage | default (include "hoststack.image" .) }}
{{- end }}
