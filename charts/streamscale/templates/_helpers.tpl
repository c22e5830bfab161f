{{- define "streamscale.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- define "streamscale.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "streamscale.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "streamscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "streamscale.fullname" .) .Values.serviceAccount.name }}{{- else -}}{{ required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}
{{/* Labels of the operator's pods: the selector labels and networkPolicy.operatorPodLabels. */}}
{{- define "streamscale.podLabels" -}}
{{ include "streamscale.selectorLabels" . }}
{{- with .Values.networkPolicy.operatorPodLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}
{{/* A label map as KEY=VALUE,... */}}
{{- define "streamscale.labelList" -}}
{{- $items := list -}}
{{- range $k, $v := . -}}{{- $items = append $items (printf "%s=%s" $k $v) -}}{{- end -}}
{{- join "," $items -}}
{{- end -}}
