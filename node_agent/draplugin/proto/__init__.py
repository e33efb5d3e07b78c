"""The kubelet's pluginregistration/v1, dra/v1 and dra/v1beta1 protos and their generated
stubs (../regen.sh)."""
