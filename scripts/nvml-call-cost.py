#!/usr/bin/env python3
"""CPU time of each NVML call the `nvidia` collector makes per device and scrape, on this node.

Run on a GPU node (the device machine): `python3 scripts/nvml-call-cost.py [ROUNDS]`. It loads
libnvidia-ml.so.1 with ctypes, calls each function ROUNDS times (200) on GPU 0 and prints the
CPU time (user + system, this process) per call in microseconds, so the collector's per-GPU
cost can be traced to the calls that make it. Nothing is changed on the device.
"""
import ctypes
import sys
import time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200

nvml = ctypes.CDLL("libnvidia-ml.so.1")


def check(ret, what):
    if ret != 0:
        nvml.nvmlErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: {nvml.nvmlErrorString(ret).decode()}")


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class FieldValue(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_int),
        ("nvmlReturn", ctypes.c_int),
        ("value", ctypes.c_ulonglong),
    ]


class ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t of the _v3 calls.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


check(nvml.nvmlInit_v2(), "nvmlInit_v2")
dev = ctypes.c_void_p()
check(nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)), "handle")

u = Utilization()
m = Memory()
ull = ctypes.c_ulonglong()
ui = ctypes.c_uint()
fields2 = (FieldValue * 2)()
fields2[0].fieldId, fields2[1].fieldId = 83, 185
count = ctypes.c_uint()
procs = (ProcessInfo * 64)()
handle = ctypes.c_void_p()

calls = {
    "nvmlDeviceGetHandleByIndex_v2": lambda: nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)),
    "nvmlDeviceGetFieldValues(energy, power avg)": lambda: nvml.nvmlDeviceGetFieldValues(dev, 2, fields2),
    "nvmlDeviceGetTotalEnergyConsumption": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(dev, ctypes.byref(ull)),
    "nvmlDeviceGetPowerUsage": lambda: nvml.nvmlDeviceGetPowerUsage(dev, ctypes.byref(ui)),
    "nvmlDeviceGetUtilizationRates": lambda: nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u)),
    "nvmlDeviceGetMemoryInfo": lambda: nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(m)),
    "nvmlDeviceGetCurrentClocksThrottleReasons": lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(dev, ctypes.byref(ull)),
    "nvmlDeviceGetTemperature(GPU)": lambda: nvml.nvmlDeviceGetTemperature(dev, 0, ctypes.byref(ui)),
    "nvmlDeviceGetClockInfo(SM)": lambda: nvml.nvmlDeviceGetClockInfo(dev, 1, ctypes.byref(ui)),
    "nvmlDeviceGetClockInfo(MEM)": lambda: nvml.nvmlDeviceGetClockInfo(dev, 2, ctypes.byref(ui)),
    "nvmlDeviceGetComputeRunningProcesses_v3 (count)": lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(ctypes.c_uint(0)), None),
    "nvmlDeviceGetComputeRunningProcesses_v3 (list)": lambda: nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(ctypes.c_uint(64)), procs),
    "nvmlDeviceGetMinorNumber": lambda: nvml.nvmlDeviceGetMinorNumber(dev, ctypes.byref(ui)),
    "nvmlDeviceGetCount_v2": lambda: nvml.nvmlDeviceGetCount_v2(ctypes.byref(ui)),
}

print(f"NVML CPU time per call on GPU 0, {ROUNDS} rounds each (user + system of this process):")
total = 0.0
for name, call in calls.items():
    call()  # warm
    t0 = time.process_time()
    w0 = time.perf_counter()
    for _ in range(ROUNDS):
        call()
    cpu_us = (time.process_time() - t0) / ROUNDS * 1e6
    wall_us = (time.perf_counter() - w0) / ROUNDS * 1e6
    print(f"  {name:<52} {cpu_us:9.1f} us CPU {wall_us:9.1f} us wall")
# The empty Python loop's own cost, to subtract.
t0 = time.process_time()
for _ in range(ROUNDS):
    (lambda: 0)()
print(f"  {'(python call overhead)':<52} {(time.process_time() - t0) / ROUNDS * 1e6:9.1f} us CPU")
check(nvml.nvmlShutdown(), "nvmlShutdown")
