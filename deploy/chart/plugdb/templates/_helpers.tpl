{{/* The labels every object of the release carries, and the operator pods' selector. */}}
{{- define "plugdb.selector" -}}
app.kubernetes.io/name: plugdb
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
