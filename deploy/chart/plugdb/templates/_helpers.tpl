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

{{/*
What the operator may do to Databases and their children, in a ClusterRole or, with
watchNamespace, a Role in that namespace. Secrets: the credentials, the application's
login, the Database's authority and certificates; it deletes only those a Database made,
under deletionPolicy Delete. Jobs: backups, restores, upgrade and scale steps. Pods: a
member's role label, fence and follow marks, and the restarts of a roll.
*/}}
{{- define "plugdb.databaseRules" -}}
- apiGroups: ["plugdb.io"]
  resources: ["databases"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["plugdb.io"]
  resources: ["databases/status"]
  verbs: ["get", "patch"]
- apiGroups: ["plugdb.io"]
  resources: ["databases/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Each Database's members' NetworkPolicy: their agent port reached from the operator alone.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch"]
# spec.tls.issuerRef: the Database's certificate, issued by cert-manager.
- apiGroups: ["cert-manager.io"]
  resources: ["certificates"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
