"""The AWS contract the simulation layer holds every run to (docs/aws-contract.md).

moto and our simulation accept requests AWS refuses, never evaluate IAM, and never give
several answers AWS documents. The guards here close that gap for every run built on the
simulation layer (tests, demo, playground, crash campaigns):

* requests: each request the handlers send is checked against its operation's input shape in
  the service models botocore ships (patterns, lengths, sizes, enums, ranges) and against the
  limits the API references state only in prose;
* grants: each call a Lambda function makes must be allowed by that function's own role in
  the synthesized template (action, resource ARN IAM evaluates, conditions).
"""
