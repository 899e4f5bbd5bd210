{{/*
Names. The full name is the release name, followed by "-appwrapper-dispatcher" unless it
contains the chart's name: `helm install appwrapper-dispatcher ...` names every object as
manifests/ does. Cluster-scoped objects that people name (the user roles, the status policy)
take the prefix: the full name without "-dispatcher" ("appwrapper").
*/}}
{{- define "awd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "awd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "awd.prefix" -}}
{{- include "awd.fullname" . | trimSuffix "-dispatcher" -}}
{{- end -}}

{{- define "awd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "awd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "awd.labels" -}}
{{ include "awd.selectorLabels" . }}
app.kubernetes.io/part-of: appwrapper-dispatcher
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The dispatcher's ServiceAccount: serviceAccount.name, or the full name. With
serviceAccount.create false the chart makes none but binds its roles to this one, so it must
be named.
*/}}
{{- define "awd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "awd.fullname" .) .Values.serviceAccount.name -}}
{{- else if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- fail "serviceAccount.create false needs serviceAccount.name: the ServiceAccount (made beforehand) the chart binds the dispatcher's roles to" -}}
{{- end -}}
{{- end -}}

{{- define "awd.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "awd.serviceAccountName" . }}
{{- end -}}

{{/*
The cert-manager issuer of the chart's Certificates: certManager.issuerRef, or the chart's
own self-signed Issuer (certificate.yaml makes it only then).
*/}}
{{- define "awd.issuerRef" -}}
{{- with .Values.certManager.issuerRef -}}
{{- toYaml . -}}
{{- else -}}
kind: Issuer
name: {{ include "awd.fullname" . }}-selfsigned
{{- end -}}
{{- end -}}

{{/*
A probe from the values, as YAML; with metrics.secure the health port serves HTTPS only, so an
httpGet that names no scheme is given `scheme: HTTPS` (the kubelet does not verify it).
Arguments: (list $ probe).
*/}}
{{- define "awd.probe" -}}
{{- $root := index . 0 -}}
{{- $probe := deepCopy (index . 1 | default dict) -}}
{{- if and $root.Values.metrics.secure $probe.httpGet (not (hasKey $probe.httpGet "scheme")) -}}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}

{{- define "awd.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The settings file: .Values.config with what must agree with the chart's own objects set by
the chart. A value the user gave for one of those keys that differs is refused, with the key
named, rather than silently replaced.
*/}}
{{- define "awd.pin" -}}
{{- $where := index . 0 -}}
{{- $key := index . 1 -}}
{{- $want := index . 2 -}}
{{- $path := index . 3 -}}
{{- if and (hasKey $where $key) (ne (toString (index $where $key)) (toString $want)) -}}
{{- fail (printf "config.%s is set by the chart to %v (it must agree with the chart's own objects), not %v" $path $want (index $where $key)) -}}
{{- end -}}
{{- $_ := set $where $key $want -}}
{{- end -}}

{{- define "awd.settings" -}}
{{- $full := include "awd.fullname" . -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $webhook := deepCopy (get $cfg "webhook" | default dict) -}}
{{- if gt (int .Values.replicas) 1 -}}
{{- include "awd.pin" (list $cfg "leader_election" true "leader_election") -}}
{{- end -}}
{{- include "awd.pin" (list $cfg "lease_namespace" .Release.Namespace "lease_namespace") -}}
{{- include "awd.pin" (list $cfg "lease_name" $full "lease_name") -}}
{{- include "awd.pin" (list $webhook "enabled" true "webhook.enabled") -}}
{{- include "awd.pin" (list $webhook "namespace" .Release.Namespace "webhook.namespace") -}}
{{- include "awd.pin" (list $webhook "service_name" (printf "%s-webhook" $full) "webhook.service_name") -}}
{{- include "awd.pin" (list $webhook "secret_name" (printf "%s-webhook" $full) "webhook.secret_name") -}}
{{- include "awd.pin" (list $webhook "mutating_configuration" $full "webhook.mutating_configuration") -}}
{{- include "awd.pin" (list $webhook "validating_configuration" $full "webhook.validating_configuration") -}}
{{- if .Values.certManager.enabled -}}
{{- include "awd.pin" (list $webhook "cert_dir" "/etc/appwrapper-dispatcher-webhook" "webhook.cert_dir") -}}
{{- end -}}
{{- if not (hasKey $webhook "port") -}}
{{- $_ := set $webhook "port" 9443 -}}
{{- end -}}
{{- if not (hasKey $cfg "health_port") -}}
{{- $_ := set $cfg "health_port" 8081 -}}
{{- end -}}
{{- if eq (int $cfg.health_port) 0 -}}
{{- fail "config.health_port 0 turns off /healthz, which the pods' probes and the metrics Service use: pick a port" -}}
{{- end -}}
{{- if eq (int $webhook.port) 0 -}}
{{- fail "config.webhook.port 0 (any free port) cannot be named by the webhook Service: pick a port" -}}
{{- end -}}
{{- $_ := set $cfg "webhook" $webhook -}}
{{- if .Values.metrics.secure -}}
{{- /* HTTPS with the certificate the pods mount (metrics-cert.yaml), and every scraper's
token and right reviewed. */ -}}
{{- $metrics := deepCopy (get $cfg "metrics" | default dict) -}}
{{- include "awd.pin" (list $metrics "cert_file" "/etc/appwrapper-dispatcher-metrics/tls.crt" "metrics.cert_file") -}}
{{- include "awd.pin" (list $metrics "key_file" "/etc/appwrapper-dispatcher-metrics/tls.key" "metrics.key_file") -}}
{{- include "awd.pin" (list $metrics "auth" "kubernetes" "metrics.auth") -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- end -}}
{{- $visibility := deepCopy (get $cfg "visibility" | default dict) -}}
{{- if $visibility.enabled -}}
{{- include "awd.pin" (list $visibility "namespace" .Release.Namespace "visibility.namespace") -}}
{{- include "awd.pin" (list $visibility "service_name" (printf "%s-visibility" $full) "visibility.service_name") -}}
{{- if not (hasKey $visibility "port") -}}
{{- $_ := set $visibility "port" 8444 -}}
{{- end -}}
{{- if eq (int $visibility.port) 0 -}}
{{- fail "config.visibility.port 0 (any free port) cannot be named by the visibility Service: pick a port" -}}
{{- end -}}
{{- $_ := set $cfg "visibility" $visibility -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The rules for the wrapped kinds: one per kind of config.allowed_kinds, from
rbac.wrappedKinds. get to adopt an object that exists already (after a restart) and to read
completion, create to dispatch, delete on requeue, failure, preemption and AppWrapper
deletion; list and watch for the kinds whose completion is watched. Never update or patch.
*/}}
{{- define "awd.wrappedRules" -}}
{{- $table := .Values.rbac.wrappedKinds | default dict -}}
{{- $kinds := .Values.config.allowed_kinds | default list -}}
{{- if not $kinds -}}
{{- fail "config.allowed_kinds is empty: list the kinds AppWrappers may wrap (the chart's values.yaml has the default list)" -}}
{{- end -}}
{{- range $kind := $kinds | uniq | sortAlpha }}
{{- $entry := get $table $kind -}}
{{- if not $entry -}}
{{- fail (printf "config.allowed_kinds names %s, which rbac.wrappedKinds does not place: add rbac.wrappedKinds.%s with its apiGroups and resources" $kind $kind) -}}
{{- end }}
# {{ $kind }}
- apiGroups: {{ toJson $entry.apiGroups }}
  resources: {{ toJson $entry.resources }}
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end -}}
{{- end -}}

{{/*
A list of strings as CEL string literals, comma-separated. Usernames are refused unless they
are plain (letters, digits and -_.:@), so no quote can end a literal early.
*/}}
{{- define "awd.celStrings" -}}
{{- $out := list -}}
{{- range . -}}
{{- if not (regexMatch "^[A-Za-z0-9:@._-]+$" .) -}}
{{- fail (printf "statusPolicy.extraWriters: %q is not a plain username (letters, digits and -_.:@)" .) -}}
{{- end -}}
{{- $out = append $out (printf "'%s'" .) -}}
{{- end -}}
{{- join ", " $out -}}
{{- end -}}
