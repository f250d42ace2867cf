{{/* The labels every object of the release carries, and the operator pods' selector. */}}
{{- define "plugdb.selector" -}}
app.kubernetes.io/name: plugdb
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The operator's resources: those given, with a memory limit that follows
expectedDatabases unless one is given: 400 Mi for what plugins can make the operator
spend at worst, and 24 Ki per Database (docs/operations.md, Sizing).
*/}}
{{- define "plugdb.resources" -}}
{{- $resources := deepCopy .Values.resources -}}
{{- $limits := $resources.limits | default dict -}}
{{- if not (hasKey $limits "memory") -}}
{{- $_ := set $limits "memory" (printf "%dMi" (add 400 (div (mul (int .Values.expectedDatabases) 24) 1024))) -}}
{{- end -}}
{{- $_ := set $resources "limits" $limits -}}
{{- toYaml $resources -}}
{{- end -}}
