"""Vulkan compute through the `vulkan` package (cffi over the system's Vulkan loader): device
selection, buffers, pipelines (cached by their SPIR-V), dispatch and timing.

A kernel's argument i is the storage buffer at (set 0, binding i), MLIR's default interface ABI
for the SPIR-V it makes. Buffers are host-visible and coherent: the arrays are copied in and the
results out through mapped memory, which on lavapipe (Mesa's Vulkan driver on the CPU, the
device of these machines) is all the memory there is; a discrete GPU would want device-local
buffers and staging copies, which no device here can measure.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..errors import TraceaError
from .dtypes import to_numpy
from .gpu_artifact import checked_inputs

API_VERSION = (1, 3)
COOPERATIVE_MATRIX = "VK_KHR_cooperative_matrix"


class VulkanError(TraceaError, RuntimeError):
    """No usable Vulkan here, or the driver refused a call."""


def _vk():
    try:
        import vulkan
    except ImportError:
        raise VulkanError("the Vulkan runtime needs the `vulkan` package (pip install vulkan==1.3.275.1)") from None
    except OSError as e:  # the package loads libvulkan.so.1 when imported
        raise VulkanError(f"no Vulkan loader on this machine ({e}); on Debian: apt-get install libvulkan1 "
                          "mesa-vulkan-drivers (lavapipe, Vulkan on the CPU)") from None
    return vulkan


def _check(call, what: str):
    """Run a Vulkan call, turning the binding's error classes into a VulkanError naming `what`."""
    vk = _vk()
    try:
        return call()
    except (vk.VkError, vk.VkException) as e:
        raise VulkanError(f"Vulkan refused to {what}: {type(e).__name__}") from None


@dataclass
class Buffer:
    handle: object
    memory: object
    mapped: object  # a cffi buffer over the mapped memory
    nbytes: int


@dataclass
class Pipeline:
    pipeline: object
    layout: object
    set_layout: object


class VulkanDevice:
    """One physical device, its logical device and compute queue (made on first use), and the
    pipelines built on it."""

    _instance = None
    _devices: list["VulkanDevice"] | None = None
    _lock = threading.Lock()

    def __init__(self, physical):
        vk = _vk()
        self.physical = physical
        self.properties = vk.vkGetPhysicalDeviceProperties(physical)
        self.name = self.properties.deviceName
        subgroup = vk.VkPhysicalDeviceSubgroupProperties()
        vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=subgroup))
        self.subgroup_size = subgroup.subgroupSize
        self.extensions = frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None))
        self.matrix_tile = self._cooperative_tile() if COOPERATIVE_MATRIX in self.extensions else 0
        v11 = vk.VkPhysicalDeviceVulkan11Features()
        v12 = vk.VkPhysicalDeviceVulkan12Features(pNext=v11)
        features = vk.VkPhysicalDeviceFeatures2(pNext=v12)
        vk.vkGetPhysicalDeviceFeatures2(physical, features)
        # 16-bit kernels: f16 ones need f16 arithmetic, bf16 ones (stored as i16) 16-bit integers
        self.f16_storage = bool(v11.storageBuffer16BitAccess and v12.shaderFloat16 and features.features.shaderInt16)
        memory = vk.vkGetPhysicalDeviceMemoryProperties(physical)
        self.memory_bytes = max(memory.memoryHeaps[i].size for i in range(memory.memoryHeapCount))
        self._memory_types = [(memory.memoryTypes[i].propertyFlags) for i in range(memory.memoryTypeCount)]
        self._device = None
        self._pipelines: dict[tuple[bytes, str], Pipeline] = {}
        self._buffers: dict[tuple[int, int], Buffer] = {}  # (argument index, bytes) -> reused buffer

    def _cooperative_tile(self) -> int:
        """The square tile of f16 x f16 + f32 -> f32 subgroup cooperative matrices this device
        lists (16 where it has it, else the largest; 0: none). A kernel's tile must be one the
        device lists: lavapipe (Mesa 25.1 on) has only 8 x 8 x 8."""
        vk = _vk()
        query = vk.vkGetInstanceProcAddr(VulkanDevice._instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
        f16, f32 = vk.VK_COMPONENT_TYPE_FLOAT16_KHR, vk.VK_COMPONENT_TYPE_FLOAT32_KHR
        tiles = {p.MSize for p in _check(lambda: query(self.physical), "list its cooperative matrix shapes")
                 if p.MSize == p.NSize == p.KSize and (p.AType, p.BType, p.CType, p.ResultType) == (f16, f16, f32, f32)
                 and p.scope == vk.VK_SCOPE_SUBGROUP_KHR and not p.saturatingAccumulation}
        return 16 if 16 in tiles else max(tiles, default=0)

    # -- finding devices ------------------------------------------------------------------
    @classmethod
    def all(cls) -> list["VulkanDevice"]:
        with cls._lock:
            if cls._devices is None:
                vk = _vk()
                app = vk.VkApplicationInfo(pApplicationName="tracea", apiVersion=vk.VK_MAKE_VERSION(*API_VERSION, 0))
                cls._instance = _check(lambda: vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None),
                                       "create an instance (is a Vulkan driver installed?)")
                cls._devices = [cls(p) for p in _check(lambda: vk.vkEnumeratePhysicalDevices(cls._instance),
                                                       "list the devices")]
            return cls._devices

    @classmethod
    def get(cls, index: int = 0) -> "VulkanDevice":
        devices = cls.all()
        if not devices:
            raise VulkanError("the Vulkan loader sees no device; on Debian apt-get install mesa-vulkan-drivers "
                              "gives lavapipe (Vulkan on the CPU)")
        if not 0 <= index < len(devices):
            raise VulkanError(f"there is no vulkan:{index}; this machine has "
                              + ", ".join(f"vulkan:{i} ({d.name})" for i, d in enumerate(devices)))
        return devices[index]

    def gpu(self):
        """This device as the Doctor's GPU record."""
        from ..doctor.capabilities import GPU
        vk, p = _vk(), self.properties
        # the Vulkan version the SPIR-V is made and validated for: the device's, up to API_VERSION
        # (the instance asks for no more; a Vulkan 1.4 device runs 1.3's SPIR-V)
        version = "vulkan%d.%d" % min((vk.VK_VERSION_MAJOR(p.apiVersion), vk.VK_VERSION_MINOR(p.apiVersion)), API_VERSION)
        limits = p.limits
        return GPU(version, self.name, 0, 1, self.subgroup_size, limits.maxComputeSharedMemorySize,
                   limits.maxComputeSharedMemorySize, 0, 0, limits.maxComputeWorkGroupInvocations,
                   "cooperative_matrix" if self.matrix_tile else "", "", self.memory_bytes,
                   driver_version=str(p.driverVersion), f16_storage=self.f16_storage, matrix_tile=self.matrix_tile)

    # -- the logical device -----------------------------------------------------------------
    def _logical(self):
        if self._device is None:
            vk = _vk()
            families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
            compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
            if not compute:
                raise VulkanError(f"{self.name} has no compute queue")
            self.family = compute[0]
            queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1, pQueuePriorities=[1.0])
            # 16-bit kernels need the features on: 16-bit storage buffers, f16 arithmetic, 16-bit integers
            v11 = vk.VkPhysicalDeviceVulkan11Features(storageBuffer16BitAccess=self.f16_storage)
            v12 = vk.VkPhysicalDeviceVulkan12Features(pNext=v11, shaderFloat16=self.f16_storage)
            features = vk.VkPhysicalDeviceFeatures2(pNext=v12, features=vk.VkPhysicalDeviceFeatures(
                shaderInt16=self.f16_storage))
            info = vk.VkDeviceCreateInfo(pNext=features, pQueueCreateInfos=[queue])
            self._device = _check(lambda: vk.vkCreateDevice(self.physical, info, None), f"open {self.name}")
            self.queue = vk.vkGetDeviceQueue(self._device, self.family, 0)
            self.command_pool = vk.vkCreateCommandPool(self._device, vk.VkCommandPoolCreateInfo(
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.family), None)
            self.fence = vk.vkCreateFence(self._device, vk.VkFenceCreateInfo(), None)
        return self._device

    def buffer(self, slot: int, nbytes: int) -> Buffer:
        """A host-visible storage buffer of `nbytes` for argument `slot`, kept for the next call."""
        key = (slot, nbytes)
        if key not in self._buffers:
            vk, device = _vk(), self._logical()
            handle = _check(lambda: vk.vkCreateBuffer(device, vk.VkBufferCreateInfo(
                size=nbytes, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None), f"create a buffer of {nbytes} bytes")
            need = vk.vkGetBufferMemoryRequirements(device, handle)
            want = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            types = [i for i, flags in enumerate(self._memory_types)
                     if need.memoryTypeBits >> i & 1 and flags & want == want]
            if not types:
                raise VulkanError(f"{self.name} has no host-visible coherent memory for a storage buffer")
            memory = _check(lambda: vk.vkAllocateMemory(device, vk.VkMemoryAllocateInfo(
                allocationSize=need.size, memoryTypeIndex=types[0]), None), f"allocate {need.size} bytes")
            vk.vkBindBufferMemory(device, handle, memory, 0)
            self._buffers[key] = Buffer(handle, memory, vk.vkMapMemory(device, memory, 0, nbytes, 0), nbytes)
        return self._buffers[key]

    def pipeline(self, spirv: bytes, entry: str, bindings: int) -> Pipeline:
        """The compute pipeline of `entry` in the SPIR-V module, built once per process."""
        key = (hashlib.sha256(spirv).digest(), entry)
        if key not in self._pipelines:
            vk, device = _vk(), self._logical()
            set_layout = vk.vkCreateDescriptorSetLayout(device, vk.VkDescriptorSetLayoutCreateInfo(pBindings=[
                vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                for i in range(bindings)]), None)
            layout = vk.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(pSetLayouts=[set_layout]), None)
            module = _check(lambda: vk.vkCreateShaderModule(device, vk.VkShaderModuleCreateInfo(
                codeSize=len(spirv), pCode=spirv), None), "take the SPIR-V module")
            # (each struct is kept in a variable: a temporary's strings would be freed before the call)
            stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName=entry)
            info = vk.VkComputePipelineCreateInfo(stage=stage, layout=layout)
            pipeline = _check(lambda: vk.vkCreateComputePipelines(device, None, 1, [info], None)[0],
                              f"build the compute pipeline of {entry}")
            vk.vkDestroyShaderModule(device, module, None)
            self._pipelines[key] = Pipeline(pipeline, layout, set_layout)
        return self._pipelines[key]

    def dispatch(self, pipeline: Pipeline, buffers: list[Buffer], grid: tuple[int, int, int]) -> float:
        """Run `grid` workgroups of the pipeline on `buffers`; the seconds from submit to done."""
        vk, device = _vk(), self._logical()
        pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(maxSets=1, pPoolSizes=[
            vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=len(buffers))]), None)
        try:
            dset = vk.vkAllocateDescriptorSets(device, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=pool, pSetLayouts=[pipeline.set_layout]))[0]
            infos = [vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.nbytes) for b in buffers]
            writes = [vk.VkWriteDescriptorSet(dstSet=dset, dstBinding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              descriptorCount=1, pBufferInfo=[info]) for i, info in enumerate(infos)]
            vk.vkUpdateDescriptorSets(device, len(writes), writes, 0, None)
            commands = vk.vkAllocateCommandBuffers(device, vk.VkCommandBufferAllocateInfo(
                commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
            vk.vkBeginCommandBuffer(commands, vk.VkCommandBufferBeginInfo(
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            vk.vkCmdBindPipeline(commands, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline)
            vk.vkCmdBindDescriptorSets(commands, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, [dset], 0, None)
            vk.vkCmdDispatch(commands, *grid)
            vk.vkEndCommandBuffer(commands)
            submit = vk.VkSubmitInfo(pCommandBuffers=[commands])
            start = time.perf_counter()
            _check(lambda: vk.vkQueueSubmit(self.queue, 1, [submit], self.fence), "submit the dispatch")
            _check(lambda: vk.vkWaitForFences(device, 1, [self.fence], vk.VK_TRUE, 600 * 10 ** 9),
                   "finish the dispatch (the device was lost or took over 10 minutes)")
            seconds = time.perf_counter() - start
            vk.vkResetFences(device, 1, [self.fence])
            vk.vkFreeCommandBuffers(device, self.command_pool, 1, [commands])
            return seconds
        finally:
            vk.vkDestroyDescriptorPool(device, pool, None)


class VulkanKernel:
    """A SpirvKernelArtifact on a VulkanDevice: `kernel(*arrays)` checks the arrays against the
    kernel's parameters, runs it and returns the result (a new array); `kernel.seconds` is the
    last dispatch's time on the device."""

    def __init__(self, artifact, device: VulkanDevice):
        if "CooperativeMatrixKHR" in artifact.capabilities and COOPERATIVE_MATRIX not in device.extensions:
            # (lavapipe would build the pipeline and compute garbage)
            raise VulkanError(f"{artifact.name} uses cooperative matrices and {device.name} has no "
                              f"{COOPERATIVE_MATRIX}: compile it for this device (its kernels are chosen from its "
                              "properties)")
        self.artifact, self.device = artifact, device
        self.inputs = [p for p in artifact.params if not p.output]
        self.outputs = [p for p in artifact.params if p.output]
        self.pipeline = device.pipeline(artifact.spirv, artifact.name, len(artifact.params))
        self.seconds = 0.0
        self.stages: dict[str, str] = {}

    def __call__(self, *arrays):
        a = self.artifact
        buffers = []
        for slot, data in enumerate(checked_inputs(a.name, a.params, arrays)):
            buffer = self.device.buffer(slot, max(data.nbytes, 4))
            buffer.mapped[:data.nbytes] = data.reshape(-1).view(np.uint8)  # (copied once, into the mapping)
            buffers.append(buffer)
        outs = []
        for slot, param in enumerate(self.outputs, start=len(self.inputs)):
            dtype = to_numpy(param.dtype)
            nbytes = int(np.prod(param.shape)) * dtype.itemsize
            buffers.append(self.device.buffer(slot, max(nbytes, 4)))
            outs.append((param, dtype, nbytes))
        self.seconds = self.device.dispatch(self.pipeline, buffers, a.grid)
        results = [np.frombuffer(buffers[len(self.inputs) + i].mapped, dtype=dtype, count=nbytes // dtype.itemsize)
                   .reshape(param.shape).copy() for i, (param, dtype, nbytes) in enumerate(outs)]
        return results[0] if len(results) == 1 else tuple(results)
