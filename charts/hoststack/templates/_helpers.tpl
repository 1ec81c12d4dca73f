{{/* Common labels of every object of the release. */}}
{{- define "hoststack.labels" -}}
app.kubernetes.io/name: hoststack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The labels that select the operator's pods. */}}
{{- define "hoststack.operatorSelector" -}}
app.kubernetes.io/name: hoststack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The image reference, tag defaulting to the chart's appVersion. */}}
{{- define "hoststack.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The image the operator gives the agent DaemonSet: agent.image, else image. */}}
{{- define "hoststack.agentImage" -}}
{{ .Values.agent.image.repository | default .Values.image.repository }}:{{ .Values.agent.image.tag | default .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The agents' ServiceAccount user name, as the API server sees its tokens. */}}
{{- define "hoststack.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:hoststack-agent
{{- end }}

{{/* The operator's ServiceAccount user name, as the API server sees its tokens. */}}
{{- define "hoststack.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:hoststack-operator
{{- end }}
