{{/* Names and labels shared by every template. */}}

{{- define "accelbench.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "accelbench.fullname" -}}
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

{{- define "accelbench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "accelbench.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Not app.kubernetes.io/managed-by=accelbench-operator: that label marks the operator's children. */}}
{{- define "accelbench.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "accelbench.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: accelbench
{{- end -}}

{{- define "accelbench.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "accelbench.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "accelbench.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "accelbench.pricesConfigMap" -}}
{{- printf "%s-prices" (include "accelbench.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "accelbench.leaseName" -}}
{{- default (include "accelbench.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/* The namespaces the operator serves; empty in cluster scope. */}}
{{- define "accelbench.watchedNamespaces" -}}
{{- if eq .Values.scope "namespaces" -}}
{{- join "," .Values.namespaces -}}
{{- end -}}
{{- end -}}

{{/*
Refusals that the schema cannot express with a readable message. Included by the Deployment, so
they run on every render.
*/}}
{{- define "accelbench.validate" -}}
{{- if and (eq .Values.scope "namespaces") (empty .Values.namespaces) -}}
{{- fail "scope is \"namespaces\" but namespaces is empty: list the namespaces to watch, or use scope: cluster" -}}
{{- end -}}
{{- if and (eq .Values.scope "cluster") (not (empty .Values.namespaces)) -}}
{{- fail "namespaces is set but scope is \"cluster\": set scope: namespaces to watch only those namespaces" -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled: without a Lease every replica would act on every resource at once" -}}
{{- end -}}
{{- end -}}

{{/* Fail unless the Prometheus Operator's API is served. Argument: (list $ "ServiceMonitor"). */}}
{{- define "accelbench.requireMonitoringApi" -}}
{{- $root := index . 0 -}}
{{- $kind := index . 1 -}}
{{- if not ($root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}
{{- fail (printf "%s.enabled is true but the cluster does not serve monitoring.coreos.com/v1 (the Prometheus Operator's CRDs): install the Prometheus Operator (e.g. kube-prometheus-stack) first, or set %s.enabled=false. With `helm template`, pass --api-versions monitoring.coreos.com/v1" (untitle $kind) (untitle $kind)) -}}
{{- end -}}
{{- end -}}
