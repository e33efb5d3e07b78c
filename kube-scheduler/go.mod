module github.com/egpu/egpu/kube-scheduler

go 1.24

require go.yaml.in/yaml/v3 v3.0.4
