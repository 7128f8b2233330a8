{{/* Names, labels and the operator's RBAC rules, shared by the templates. */}}

{{- define "specdeploy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name; every object the chart creates is named after it. */}}
{{- define "specdeploy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "specdeploy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdeploy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "specdeploy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "specdeploy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "specdeploy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specdeploy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "specdeploy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Lease that keeps one operator active; its name is fixed in the operator (controller/leader.py). */}}
{{- define "specdeploy.leaseName" -}}
specdeploy-operator
{{- end }}

{{/* The Prometheus job of the operator's metrics: prometheus-operator names it after the Service. */}}
{{- define "specdeploy.metricsJob" -}}
{{- printf "%s-metrics" (include "specdeploy.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
What the operator does in each namespace it watches: every verb here is a call in
operator/specdeploy/reconcile (kube.py, handlers.py, analysis_loop.py) or one kopf makes for it.
Server-side apply of a child that does not exist yet is a create, so apply needs create and patch.
*/}}
{{- define "specdeploy.namespacedRules" -}}
# SDs: kopf lists and watches them, and patches its annotations while it retries a failed reconcile; the
# reconciler gets them, the resync and the analysis loop list them.
- apiGroups: [specdeploy.io]
  resources: [speculativedeployments]
  verbs: [get, list, watch, patch]
# The reconciler's merge patch of status (the only place the operator writes its state).
- apiGroups: [specdeploy.io]
  resources: [speculativedeployments/status]
  verbs: [patch]
# Children carry an owner reference with blockOwnerDeletion; clusters that run the
# OwnerReferencesPermissionEnforcement admission plugin require update on the owner's finalizers.
- apiGroups: [specdeploy.io]
  resources: [speculativedeployments/finalizers]
  verbs: [update]
# Engine Deployments: applied, read by name (readiness), listed and watched by kopf, deleted when no
# longer wanted.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# Their ReplicaSets: listed to tell which pods run with a speculative config (a rollback is done when
# none does), and whose pods wrote a series (a pod deleted before the operator started).
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list]
# The engine ConfigMap (plan.json, engine config files) and the Service: read (is it as applied?) and
# applied; a model's config.json from the ConfigMap in spec.model.configMapRef (or the draft's), and the
# probe's prompt sets (spec.analysis.probe.workloadsConfigMap): read.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, create, patch]
# Speculative pods: watched by kopf (a restart reconciles at once), listed for OOM deaths and for the pod
# the probe sends its requests to (by pod IP).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Events on SDs (MemoryPlanRejected, SpeculationRolledBack, ...).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.rbac.readSecrets }}
# Prometheus and Alertmanager headers from spec.analysis.prometheus.headersSecretRef and
# spec.alerting.headersSecretRef; the Hugging Face token from tokenSecretRef.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- if .Values.rbac.podMonitors }}
# Per-SD PodMonitors, rendered when the prometheus-operator CRD exists (and these rules let the operator).
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, list, create, patch, delete]
{{- end }}
{{- if .Values.rbac.leaderWorkerSets }}
# An SD's engines as LeaderWorkerSets where its layout spans nodes: read by name, watched by kopf (a group's
# readiness reconciles at once; the probe starts from the speculative one), applied, deleted when the layout
# moves back to one node. Their pods are listed and watched as above.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}
{{- end }}
