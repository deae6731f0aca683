"""Python analytics SDKs for `tributary-bench compare` (run in the venv `make bench` creates).

loss: enqueue --events events with segment-analytics-python or posthog, print "ENQUEUED <n> <seconds>",
      then keep running (the SDK's consumer thread uploads in the background) until the driver kills us.
rate: time --events calls of segment-analytics-python's track() (the in-memory enqueue), print
      "RATE <events> <seconds>" and exit without waiting for the uploads.

Both point the SDK at the reference collector's counting endpoint (--host http://127.0.0.1:PORT/count/NAME).
"""

import argparse
import os
import sys
import time


def make_client(sdk, host, queue_size):
    if sdk == "segment":
        from segment.analytics import Client

        return Client("bench-write-key", host=host, max_queue_size=queue_size), "track"
    if sdk == "posthog":
        from posthog import Posthog

        return Posthog("phc_bench", host=host, max_queue_size=queue_size), "capture"
    raise SystemExit(f"unknown sdk {sdk!r}: use segment or posthog")


def properties(index):
    # The properties of Tributary's benchmark event (Benchmarks/tributary-bench/Worker.swift, BenchEvent).
    return {
        "product_id": f"SKU-{100000 + index % 900000}",
        "product_name": "Loose-leaf green tea, 500 g tin",
        "product_category": "groceries/tea",
        "price": 12.5,
        "quantity": 1 + index % 3,
        "in_stock": True,
        "screen": "ProductDetail",
        "index": index,
    }


def enqueue(client, method, sdk, count):
    started = time.perf_counter()
    for index in range(count):
        if sdk == "segment":
            client.track(user_id="user-1", event="BuyProduct", properties=properties(index))
        else:
            client.capture("BuyProduct", distinct_id="user-1", properties=properties(index))
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["loss", "rate"])
    parser.add_argument("--sdk", default="segment")
    parser.add_argument("--host", required=True)
    parser.add_argument("--events", type=int, default=10000)
    args = parser.parse_args()

    # The SDKs' default queue (10,000) holds a loss run; a rate run gets room for every event, so that
    # none is dropped for a full queue and every call does the whole enqueue.
    queue_size = 10000 if args.mode == "loss" else args.events + 1
    client, method = make_client(args.sdk, args.host, queue_size)
    seconds = enqueue(client, method, args.sdk, args.events)
    if args.mode == "rate":
        print(f"RATE {args.events} {seconds:.6f}", flush=True)
        os._exit(0)  # do not wait for the background uploads
    print(f"ENQUEUED {args.events} {seconds:.6f}", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
