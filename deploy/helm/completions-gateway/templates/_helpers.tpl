{{/* Names and labels (app.kubernetes.io/*). */}}
{{- define "gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gateway.fullname" -}}
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

{{- define "gateway.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gateway.labels" -}}
{{ include "gateway.commonLabels" . }}
{{ include "gateway.selectorLabels" . }}
{{- end }}

{{- define "gateway.redisLabels" -}}
{{ include "gateway.commonLabels" . }}
{{ include "gateway.redisSelectorLabels" . }}
{{- end }}

{{- define "gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "gateway.metricsLabels" -}}
{{ include "gateway.commonLabels" . }}
{{ include "gateway.metricsSelectorLabels" . }}
{{- end }}

{{/* The metrics Service's own labels (its pods are the gateway's). */}}
{{- define "gateway.metricsSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: metrics
{{- end }}

{{/* Does the gateway export metrics (config.metrics.enabled, true unless set false)? */}}
{{- define "gateway.metricsOn" -}}
{{- if ne (toString (dig "enabled" true (default dict .Values.config.metrics))) "false" }}true{{ end }}
{{- end }}

{{- define "gateway.redisName" -}}
{{- printf "%s-redis" (include "gateway.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gateway.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret whose keys become the gateway's environment. */}}
{{- define "gateway.secretName" -}}
{{- default (include "gateway.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{/* Is rate limiting shared through a Redis this chart wires up? */}}
{{- define "gateway.redisWired" -}}
{{- if and .Values.redis.enabled (or .Values.externalRedis.url .Values.externalRedis.existingSecret) }}
{{- fail "redis.enabled and externalRedis are exclusive: use the in-cluster Redis or an external one" }}
{{- end }}
{{- if or .Values.redis.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret }}true{{ end }}
{{- end }}

{{/* Pods that can run at once. The rate limiter's fallback (Redis down) divides each limit
     by this times the workers of a pod (each process counts on its own then), so that all of
     them together never admit more than the limit. */}}
{{- define "gateway.maxPods" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.maxReplicas }}{{ else }}{{ .Values.replicaCount }}{{ end }}
{{- end }}

{{/* Is files.store a directory in the pod (not an object store URL)? */}}
{{- define "gateway.localStore" -}}
{{- if not (regexMatch "^[a-z0-9]+://" .Values.files.store) }}true{{ end }}
{{- end }}

{{/* The PersistentVolumeClaim mounted at the store's directory, if any. */}}
{{- define "gateway.filesClaim" -}}
{{- if and (include "gateway.localStore" .) .Values.files.persistence.enabled }}
{{- default (printf "%s-files" (include "gateway.fullname" .)) .Values.files.persistence.existingClaim }}
{{- end }}
{{- end }}

{{/* Several pods share files and batches only through an object store, and lease batches
     through the rate limiter's Redis: refuse what would split them per pod. */}}
{{- define "gateway.checkFiles" -}}
{{- range $block := list "files" "batches" }}
{{- if hasKey $.Values.config $block }}
{{- fail (printf "config.%s: set the chart's %s values instead (the chart renders them and mounts the store)" $block $block) }}
{{- end }}
{{- end }}
{{- $pods := ternary (printf "autoscaling (up to %v pods)" .Values.autoscaling.maxReplicas) (printf "replicaCount %v" .Values.replicaCount) .Values.autoscaling.enabled }}
{{- $many := or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1) }}
{{- if and $many (include "gateway.localStore" .) }}
{{- fail (printf "files.store %s is a directory, one pod's own: with %s, use an object-store URL (s3://, gs://, az://) and the redis rate-limit backend (redis.enabled or externalRedis)" .Values.files.store $pods) }}
{{- end }}
{{- $backend := (default dict .Values.config.rate_limit).backend }}
{{- if and $many (not (include "gateway.redisWired" .)) (ne (toString $backend) "redis") }}
{{- fail (printf "with %s, batches are leased through Redis: use the redis rate-limit backend (redis.enabled or externalRedis)" $pods) }}
{{- end }}
{{- end }}

{{/* Several workers in a pod count rate limits apart on the memory backend: refuse a limit
     there, naming it (the gateway refuses the same at start). */}}
{{- define "gateway.checkWorkers" -}}
{{- $workers := int .Values.gateway.workers }}
{{- $backend := (default dict .Values.config.rate_limit).backend }}
{{- if and (gt $workers 1) (not (include "gateway.redisWired" .)) (ne (toString $backend) "redis") }}
{{- range $i, $key := (default dict .Values.config.auth).keys }}
{{- if or $key.limits $key.model_limits }}
{{- fail (printf "config.auth.keys[%d] sets rate limits: with gateway.workers %d, use the redis rate-limit backend (redis.enabled or externalRedis); the memory backend would count them in each worker apart" $i $workers) }}
{{- end }}
{{- end }}
{{- range $alias, $model := .Values.config.models }}
{{- if $model.limits }}
{{- fail (printf "config.models.%s.limits: with gateway.workers %d, use the redis rate-limit backend (redis.enabled or externalRedis); the memory backend would count them in each worker apart" $alias $workers) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The gateway's config.yaml: the user's config plus what the deployment decides (listen
     address and port, the metrics' own; the Redis the chart wires up; files and batches). */}}
{{- define "gateway.config" -}}
{{- include "gateway.checkFiles" . }}
{{- include "gateway.checkWorkers" . }}
{{- $cfg := deepCopy .Values.config }}
{{- $server := deepCopy (default dict $cfg.server) }}
{{- $_ := set $server "host" "0.0.0.0" }}
{{- $_ := set $server "port" 8080 }}
{{- $_ := set $cfg "server" $server }}
{{- if include "gateway.metricsOn" . }}
{{- $metrics := deepCopy (default dict $cfg.metrics) }}
{{- $_ := set $metrics "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port)) }}
{{- $_ := set $cfg "metrics" $metrics }}
{{- end }}
{{- if include "gateway.redisWired" . }}
{{- $limits := deepCopy (default dict $cfg.rate_limit) }}
{{- $_ := set $limits "backend" "redis" }}
{{- $_ := set $limits "redis_url" "${GATEWAY_REDIS_URL}" }}
{{- $_ := set $limits "replicas" (mul (int (include "gateway.maxPods" .)) (int .Values.gateway.workers)) }}
{{- $_ := set $cfg "rate_limit" $limits }}
{{- end }}
{{- $_ := set $cfg "files" (dict "store" .Values.files.store "max_bytes" (int64 .Values.files.maxBytes)) }}
{{- $b := .Values.batches }}
{{- $batches := dict "max_concurrency" (int $b.maxConcurrency) "live_concurrency" (int $b.liveConcurrency) "poll_s" $b.pollSeconds "lease_s" $b.leaseSeconds }}
{{- if not (kindIs "invalid" $b.windowSeconds) }}
{{- $_ := set $batches "window_s" (int $b.windowSeconds) }}
{{- end }}
{{- $_ := set $cfg "batches" $batches }}
{{- toYaml $cfg }}
{{- end }}

{{/* Seconds a stopping pod may take: the preStop wait, the requests in progress, a margin.
     A model allowed to run longer than maxRequestSeconds would be cut by every rollout. */}}
{{- define "gateway.gracePeriod" -}}
{{- range $alias, $model := .Values.config.models }}
{{- $t := $model.timeout | default dict }}
{{- $total := $model.timeout_s | default (and (kindIs "map" $t) $t.total_s) }}
{{- if and $total (gt (float64 $total) (float64 $.Values.gateway.maxRequestSeconds)) }}
{{- fail (printf "config.models.%s: its total timeout (%v s) is above gateway.maxRequestSeconds (%v s); a stopping pod would cut its requests" $alias $total $.Values.gateway.maxRequestSeconds) }}
{{- end }}
{{- end }}
{{- add .Values.gateway.preStopSeconds .Values.gateway.maxRequestSeconds 15 }}
{{- end }}

{{/* The gateway container's env list (without the Secret, which comes through envFrom). */}}
{{- define "gateway.env" -}}
{{- if include "gateway.redisWired" . }}
- name: GATEWAY_REDIS_URL
{{- if .Values.redis.enabled }}
  value: "redis://{{ include "gateway.redisName" . }}:6379/0"
{{- else if .Values.externalRedis.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.externalRedis.existingSecret }}
      key: {{ .Values.externalRedis.existingSecretKey }}
{{- else }}
  value: {{ .Values.externalRedis.url | quote }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
