"""The sagemaker SDK workflow that tests/e2e/test_sdk_workflow.py runs in a process of its own."""

import json
import sys

import boto3
import sagemaker
from sagemaker.async_inference import AsyncInferenceConfig
from sagemaker.async_inference.waiter_config import WaiterConfig
from sagemaker.deserializers import JSONDeserializer
from sagemaker.multidatamodel import MultiDataModel
from sagemaker.serializers import JSONSerializer
from sagemaker.serverless import ServerlessInferenceConfig
from sagemaker.sklearn import SKLearn

bucket, source_dir = sys.argv[1:3]
session = sagemaker.Session(
    boto_session=boto3.Session(region_name="us-east-1"), default_bucket=bucket
)
role = "arn:aws:iam::123456789012:role/x"
estimator = SKLearn(
    entry_point="train.py",
    source_dir=source_dir,
    framework_version="1.2-1",
    instance_type="ml.m5.large",
    instance_count=1,
    role=role,
    sagemaker_session=session,
    output_path=f"s3://{bucket}/out",
)
estimator.fit({"train": f"s3://{bucket}/data"}, logs="All")
print("FIT_DONE", estimator.model_data, flush=True)

wait = dict(WaiterConfig={"Delay": 0.5, "MaxAttempts": 240})
kw = dict(serializer=JSONSerializer(), deserializer=JSONDeserializer())
predictor = estimator.deploy(
    initial_instance_count=1, instance_type="ml.m5.large", endpoint_name="sdk-rt", wait=False, **kw
)
session.sagemaker_client.get_waiter("endpoint_in_service").wait(EndpointName="sdk-rt", **wait)
print("REALTIME", json.dumps(predictor.predict([[1, 2]])), flush=True)

model = estimator.create_model()
mme = MultiDataModel(
    name="sdk-mme", model_data_prefix=f"s3://{bucket}/mme/", model=model, sagemaker_session=session
)
mme.add_model(model_data_source=estimator.model_data, model_data_path="first.tar.gz")
mme_predictor = mme.deploy(
    initial_instance_count=1, instance_type="ml.m5.large", endpoint_name="sdk-mme", wait=False, **kw
)
session.sagemaker_client.get_waiter("endpoint_in_service").wait(EndpointName="sdk-mme", **wait)
print("MME", json.dumps(mme_predictor.predict([[1, 2]], target_model="first.tar.gz")), flush=True)

model2 = estimator.create_model(name="sdk-async-model")
async_predictor = model2.deploy(
    initial_instance_count=1,
    instance_type="ml.m5.large",
    endpoint_name="sdk-async",
    wait=False,
    async_inference_config=AsyncInferenceConfig(output_path=f"s3://{bucket}/async-out"),
    **kw,
)
session.sagemaker_client.get_waiter("endpoint_in_service").wait(EndpointName="sdk-async", **wait)
response = async_predictor.predict_async(data=[[3, 4]])
print(
    "ASYNC", json.dumps(response.get_result(WaiterConfig(max_attempts=120, delay=0.5))), flush=True
)

model3 = estimator.create_model(name="sdk-serverless-model")
serverless_predictor = model3.deploy(
    endpoint_name="sdk-serverless",
    serverless_inference_config=ServerlessInferenceConfig(
        memory_size_in_mb=1024, max_concurrency=2
    ),
    wait=False,
    **kw,
)
session.sagemaker_client.get_waiter("endpoint_in_service").wait(
    EndpointName="sdk-serverless", **wait
)
print("SERVERLESS", json.dumps(serverless_predictor.predict([[2, 3]])), flush=True)

s3 = boto3.client("s3")
s3.put_object(Bucket=bucket, Key="batch/rows.json", Body=b"[[1, 2], [3, 4]]")
transformer = estimator.transformer(
    instance_count=1,
    instance_type="ml.m5.large",
    output_path=f"s3://{bucket}/transform-out",
    accept="application/json",
)
transformer.transform(
    f"s3://{bucket}/batch/", content_type="application/json", wait=True, logs=False
)
body = s3.get_object(Bucket=bucket, Key="transform-out/rows.json.out")["Body"].read()
print("TRANSFORM", body.decode(), flush=True)
