"""The sagemaker SDK's inference-component flow, run by tests/e2e/test_sdk_components.py in
a process of its own: Model.deploy(endpoint_type=INFERENCE_COMPONENT_BASED, resources=...)
and the Predictor it returns, unchanged."""

import json
import sys
import time

import boto3
import sagemaker
from sagemaker.compute_resource_requirements.resource_requirements import ResourceRequirements
from sagemaker.deserializers import JSONDeserializer
from sagemaker.enums import EndpointType
from sagemaker.model import Model
from sagemaker.predictor import Predictor
from sagemaker.serializers import JSONSerializer

bucket, model_data = sys.argv[1:3]
session = sagemaker.Session(
    boto_session=boto3.Session(region_name="us-east-1"), default_bucket=bucket
)
model = Model(
    image_uri="shipyard/python",
    model_data=model_data,
    role="arn:aws:iam::123456789012:role/x",
    predictor_cls=Predictor,
    sagemaker_session=session,
    name="sdk-ic-model",
)
predictor = model.deploy(
    initial_instance_count=1,
    instance_type="ml.m5.large",
    endpoint_name="sdk-ic",
    endpoint_type=EndpointType.INFERENCE_COMPONENT_BASED,
    resources=ResourceRequirements(
        requests={"num_cpus": 1, "memory": 1024, "copies": 2}, limits={}
    ),
    inference_component_name="sdk-ic-component",
    serializer=JSONSerializer(),
    deserializer=JSONDeserializer(),
    # The SDK's own waits poll every 30 s; the component is waited for below instead.
    wait=False,
)
waiter_delay = 0.25
while True:
    status = session.sagemaker_client.describe_inference_component(
        InferenceComponentName="sdk-ic-component"
    )["InferenceComponentStatus"]
    if status == "InService":
        break
    if status == "Failed":
        raise SystemExit("the component failed")
    time.sleep(waiter_delay)
print("COMPONENT", predictor.component_name, flush=True)
answer = predictor.predict({"x": 1})
print("ANSWER", json.dumps(answer["SHIPYARD_INFERENCE_COMPONENT"]), flush=True)
described = session.sagemaker_client.describe_inference_component(
    InferenceComponentName="sdk-ic-component"
)
print("COPIES", json.dumps(described["RuntimeConfig"]), flush=True)
predictor.delete_predictor()
print("DELETED", flush=True)
