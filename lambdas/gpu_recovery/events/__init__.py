"""Parser models of the AWS events the Lambdas consume (Powertools parser).

* ``ecs`` — ECS task and container-instance state changes (EventBridge)
"""
