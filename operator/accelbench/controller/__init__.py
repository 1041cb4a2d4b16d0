"""The controller: the only code that talks to the Kubernetes API.

Pure modules (conditions, observe, ingest, cost, status, children) turn API objects into status; kube does
the I/O; handlers wires both into kopf; metrics exports what the status says to Prometheus.
"""
