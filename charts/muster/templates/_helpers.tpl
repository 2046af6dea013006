{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "muster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "muster.webhook.fullname" -}}{{ include "muster.fullname" . }}-webhook{{- end }}
{{- define "muster.binder.fullname" -}}{{ include "muster.fullname" . }}-binder{{- end }}
{{- define "muster.certRotator.fullname" -}}{{ include "muster.fullname" . }}-cert-rotator{{- end }}
{{- define "muster.agent.fullname" -}}{{ include "muster.fullname" . }}-agent{{- end }}
{{- define "muster.policies.fullname" -}}{{ include "muster.fullname" . }}-policies{{- end }}
{{- define "muster.annotationGuard.name" -}}{{ include "muster.fullname" . }}-annotation-guard{{- end }}

{{/* the user names the API server gives Muster's service accounts (the annotation guard) */}}
{{- define "muster.binder.username" -}}system:serviceaccount:{{ .Release.Namespace }}:{{ include "muster.binder.fullname" . }}{{- end }}
{{- define "muster.agent.username" -}}system:serviceaccount:{{ .Release.Namespace }}:{{ include "muster.agent.fullname" . }}{{- end }}

{{/* the muster.io/ pod annotations the webhook writes on CREATE, as a CEL list: the only ones a
pod may be created with (webhook.keys.WEBHOOK_ANNOTATIONS; a chart test holds them equal) */}}
{{- define "muster.webhookAnnotationKeys" -}}
['muster.io/policy', 'muster.io/gpu-topology', 'muster.io/gang-name', 'muster.io/gang-min-member', 'muster.io/gang-timeout-seconds', 'muster.io/gang-preemption', 'muster.io/joined-gang']
{{- end }}

{{/* the muster.io/ pod annotations a pod's owner may add, change or remove after its CREATE, as
a CEL list: the job's last checkpoint, which can only make its own gang the cheaper preemption
victim (webhook.keys.USER_ANNOTATIONS; a chart test holds them equal) */}}
{{- define "muster.userAnnotationKeys" -}}
['muster.io/last-checkpoint-time']
{{- end }}

{{/* the pod annotation in which a job says when it last saved its state
(webhook.keys.ANN_LAST_CHECKPOINT) */}}
{{- define "muster.checkpointKey" -}}
muster.io/last-checkpoint-time
{{- end }}

{{/* the form of that time, RFC 3339 with its zone: the binder reads no other
(webhook.keys.CHECKPOINT_TIME; a chart test holds them equal) */}}
{{- define "muster.checkpointTimePattern" -}}
^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$
{{- end }}

{{/* Secret holding tls.crt/tls.key (+ca.crt) mounted by the webhook, for every cert mode */}}
{{- define "muster.tls.secretName" -}}
{{- if eq .Values.certs.mode "external" -}}
{{- required "certs.external.secretName is required when certs.mode=external" .Values.certs.external.secretName }}
{{- else -}}
{{- include "muster.webhook.fullname" . }}-tls
{{- end }}
{{- end }}
{{- define "muster.ca.secretName" -}}{{ include "muster.webhook.fullname" . }}-ca{{- end }}

{{/* Webhook configuration names: must sort byte-wise before istio-sidecar-injector */}}
{{- define "muster.webhookConfigName" -}}
{{- $name := printf "%s%s" .Values.webhook.configurationNamePrefix (include "muster.fullname" .) | trunc 253 -}}
{{- if not (lt $name "istio-sidecar-injector") -}}
{{- fail (printf "webhook.configurationNamePrefix: configuration name %q must sort before \"istio-sidecar-injector\" so Muster mutates pods before Istio injects its sidecar" $name) -}}
{{- end -}}
{{- $name -}}
{{- end }}

{{/* Labels ------------------------------------------------------------------------------ */}}

{{- define "muster.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "muster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: muster
{{- end }}

{{/* selector labels for one component: (dict "ctx" $ "component" "webhook") */}}
{{- define "muster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "muster.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "muster.componentLabels" -}}
{{ include "muster.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "muster.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}
{{- end }}

{{/* Security contexts ------------------------------------------------------------------- */}}

{{- define "muster.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* CLI flags: every flag the chart passes to `muster` is here, in one place -------------- */}}

{{- define "muster.globalArgs" -}}
- --log-level={{ .Values.log.level }}
{{- if .Values.log.json }}
- --log-json
{{- end }}
{{- end }}

{{/* `muster certs` flags naming the objects the self-mode certificate manager owns */}}
{{- define "muster.selfCertArgs" -}}
- --namespace={{ .Release.Namespace }}
- --service-name={{ include "muster.webhook.fullname" . }}
- --tls-secret={{ include "muster.tls.secretName" . }}
- --ca-secret={{ include "muster.ca.secretName" . }}
- --mutating-webhook-configuration={{ include "muster.webhookConfigName" . }}
- --validating-webhook-configuration={{ include "muster.webhookConfigName" . }}
- --ca-days={{ .Values.certs.self.caDays }}
- --cert-days={{ .Values.certs.self.certDays }}
- --rotate-before-days={{ .Values.certs.self.rotateBeforeDays }}
{{- end }}

{{- define "muster.webhook.args" -}}
{{ include "muster.globalArgs" . }}
- serve
- --port={{ .Values.webhook.port }}
- --policies=/etc/muster/policies
- --tls-cert-file=/etc/muster/tls/tls.crt
- --tls-key-file=/etc/muster/tls/tls.key
- --on-user-assignment={{ .Values.webhook.onUserAssignment }}
# certificates are files in every mode; in self mode the cert-rotator keeps the Secret current
- --cert-mode=files
- --namespace={{ .Release.Namespace }}
- --service-name={{ include "muster.webhook.fullname" . }}
- --policies-configmap={{ include "muster.policies.fullname" . }}
# /metrics never on the admission port: plain HTTP on its own, the pod's loopback if asked
{{- if eq (int .Values.webhook.metricsPort) (int .Values.webhook.port) }}
{{- fail "webhook.metricsPort must differ from webhook.port: metrics are never served on the admission port" }}
{{- end }}
- --metrics-port={{ .Values.webhook.metricsPort }}
{{- if .Values.webhook.metricsLocalhostOnly }}
- --metrics-host=127.0.0.1
{{- end }}
{{- with .Values.webhook.limits }}
- --max-body-bytes={{ int64 .maxBodyBytes }}
- --body-timeout={{ .bodyTimeoutSeconds }}
- --max-inflight-body-bytes={{ int64 .maxInflightBodyBytes }}
- --header-timeout={{ .headerTimeoutSeconds }}
- --idle-timeout={{ .idleTimeoutSeconds }}
- --max-connections={{ int64 .maxConnections }}
{{- if ge (int64 .reservedConnections) (int64 .maxConnections) }}
{{- fail "webhook.limits.reservedConnections must be fewer than webhook.limits.maxConnections" }}
{{- end }}
- --max-connections-per-source={{ int64 .maxConnectionsPerSource }}
- --reserved-connections={{ int64 .reservedConnections }}
- --metrics-max-connections={{ int64 .metricsMaxConnections }}
{{- end }}
{{- range .Values.webhook.excludeNamespaces }}
- --exclude-namespace={{ . }}
{{- end }}
{{- range .Values.webhook.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{- define "muster.binder.args" -}}
{{ include "muster.globalArgs" . }}
- bind
- --scheduler-name={{ .Values.binder.schedulerName }}
- --metrics-port={{ .Values.binder.metricsPort }}
- --preemption={{ .Values.binder.preemption }}
{{- with .Values.binder.networkLevels }}
{{- if kindIs "string" . }}
- --network-levels={{ . }}
{{- else }}
- --network-levels={{ range $i, $l := . }}{{ if $i }},{{ end }}{{ if kindIs "map" $l }}{{ with $l.alias }}{{ . }}={{ end }}{{ $l.nodeLabel }}{{ else }}{{ $l }}{{ end }}{{ end }}
{{- end }}
{{- end }}
{{- if .Values.binder.leaderElection.enabled }}
- --leader-elect
- --lease-name={{ .Values.binder.leaderElection.leaseName }}
- --lease-namespace={{ .Release.Namespace }}
- --identity=$(POD_NAME)
{{- end }}
{{- range .Values.binder.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* the self-mode cert-rotator (certs-rotator.yaml): reconcile, then every interval */}}
{{- define "muster.certRotator.args" -}}
{{ include "muster.globalArgs" . }}
- certs
- run
- --interval={{ .Values.certs.self.checkIntervalSeconds }}
{{ include "muster.selfCertArgs" . }}
{{- end }}

{{/* "true" when some agent of the release serves GPUs through DRA (agent.gpuServing or a pool's
mode is dra or both), else "" */}}
{{- define "muster.agent.dra" -}}
{{- $modes := append .Values.agent.gpuServingPools .Values.agent.gpuServing }}
{{- if or (has "dra" $modes) (has "both" $modes) }}true{{ end }}
{{- end }}

{{/* "true" when one agent's serving mode (the context) includes DRA, else "" */}}
{{- define "muster.agent.modeDra" -}}
{{- if has . (list "dra" "both") }}true{{ end }}
{{- end }}

{{/* the agent's arguments for one serving mode: (dict "ctx" . "mode" devicePlugin|dra|both) */}}
{{- define "muster.agent.args" -}}
{{- $v := .ctx.Values }}
{{ include "muster.globalArgs" .ctx }}
- agent
- --node-name=$(NODE_NAME)
- --kubelet-dir=/var/lib/kubelet/device-plugins
- --resource-name={{ $v.agent.resourceName }}
{{- if eq .mode "dra" }}
- --no-device-plugin
{{- else }}
- --pod-resources-socket={{ $v.agent.podResourcesDir }}/kubelet.sock
{{- end }}
- --metrics-port={{ $v.agent.metricsPort }}
{{- if include "muster.agent.modeDra" .mode }}
- --dra
- --dra-registry-dir={{ $v.agent.dra.registryDir }}
- --dra-plugin-dir={{ $v.agent.dra.pluginsDir }}/gpu.muster.io
- --cdi-dir={{ $v.agent.dra.cdiDir }}
{{- end }}
- --scheduler-name={{ $v.binder.schedulerName }}
{{- range $v.agent.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* the mutating and validating configuration names, for hooks deleting/patching them */}}
{{- define "muster.hookPodSpecCommon" -}}
serviceAccountName: {{ .sa }}
restartPolicy: Never
automountServiceAccountToken: true
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* the policy matching only the `helm test` dry-run pod (tests.podLabels in tests.namespace) */}}
{{- define "muster.selftestPolicy" -}}
apiVersion: muster.io/v1alpha1
kind: SchedulingPolicy
metadata:
  name: muster-selftest
spec:
  priority: -1000
  match:
    namespaces: [{{ .Values.tests.namespace }}]
    podSelector:
      matchLabels:
        {{- toYaml .Values.tests.podLabels | nindent 8 }}
  istio:
    optOut: true
{{- end }}

{{/*
The pod webhook entry: name, path, failurePolicy; closedLabel, the fail-closed namespace label
as a matchExpression (NotIn on the fail-open entry, In on the fail-closed one), if any.
*/}}
{{- define "muster.podsWebhook" -}}
{{- $v := .ctx.Values.webhook -}}
- name: {{ .name }}
  admissionReviewVersions: [v1]
  clientConfig:
    service:
      name: {{ include "muster.webhook.fullname" .ctx }}
      namespace: {{ .ctx.Release.Namespace }}
      path: {{ .path }}
      port: 443
    {{- with .caBundle }}
    caBundle: {{ . }}
    {{- end }}
  rules:
    - operations: [CREATE]
      apiGroups: [""]
      apiVersions: [v1]
      resources: [pods]
      scope: Namespaced
  failurePolicy: {{ .failurePolicy }}
  matchPolicy: Equivalent
  sideEffects: NoneOnDryRun
  timeoutSeconds: {{ $v.timeoutSeconds }}
  reinvocationPolicy: IfNeeded
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: NotIn
        values:
          {{- toYaml .excluded | nindent 10 }}
      {{- with .closedLabel }}
      - key: {{ .key | quote }}
        operator: {{ .operator }}
        values: [{{ .value | quote }}]
      {{- end }}
      {{- with $v.namespaceSelectorExpressions }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
  {{- with $v.objectSelector }}
  objectSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.matchConditions }}
  matchConditions:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* The training job kinds whose objects own gang pods (get: the owner chain; list: the
PodGroup janitor, and `muster analyze` reading the jobs of the PodGroups): Kubeflow's, JobSet
(pod -> Job -> JobSet), Kubeflow Trainer v2 (-> JobSet -> TrainJob) and LeaderWorkerSet (a worker
-> StatefulSet -> leader Pod -> StatefulSet -> LeaderWorkerSet). The webhook's and the reader's. */}}
{{- define "muster.jobKindRules" -}}
- apiGroups: [kubeflow.org]
  resources: [mpijobs, pytorchjobs, tfjobs, xgboostjobs, paddlejobs]
  verbs: [get, list]
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list]
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs]
  verbs: [get, list]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list]
{{- end }}
