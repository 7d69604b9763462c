"""ECS's words for a container instance's ``status`` (DescribeContainerInstances answers,
ListContainerInstances' filter, container-instance state-change events): one home for every
stage and the ECS adapter."""

ACTIVE = "ACTIVE"  # accepts tasks
DRAINING = "DRAINING"  # no new task is placed on it
INACTIVE = "INACTIVE"  # deregistered: a host that registers again is a new container instance
