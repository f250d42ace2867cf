// Command csi-loop is the test nodes' CSI driver with real capacity and real online
// expansion. Each volume is a sparse file in its node's directory, formatted XFS when it
// is created and attached through a loop device when a pod mounts it: `df`, statfs and
// ENOSPC in the pod are the volume's own. A volume grows while mounted: its file is
// extended, the loop device re-reads its size and `xfs_growfs` grows the filesystem.
//
// One process per node serves the identity, controller and node services on one socket
// and registers itself with that node's kubelet. The Kubernetes CSI sidecars drive it:
// external-provisioner deployed per node (`--node-deployment`, so each creates the
// volumes bound to its own node) and external-resizer (this driver expands on the node
// alone, so the resizer records the new size and the kubelet calls NodeExpandVolume).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// The least size of a volume: mkfs.xfs refuses smaller filesystems.
const minBytes = 300 << 20

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	registration.UnimplementedRegistrationServer
	name, node, dir, endpoint string
	// One volume operation at a time: losetup and mount are not idempotent under races.
	mu sync.Mutex
}

func main() {
	d := &driver{}
	flag.StringVar(&d.name, "name", "loop.csi.plugdb.io", "the driver's name")
	flag.StringVar(&d.node, "node", "", "this node's name")
	flag.StringVar(&d.dir, "dir", "", "where this node's volume files live")
	flag.StringVar(&d.endpoint, "endpoint", "", "the CSI socket's path")
	registry := flag.String("registry", "", "the kubelet's plugin registry directory (registers the driver there)")
	flag.Parse()
	if d.node == "" || d.dir == "" || d.endpoint == "" {
		log.Fatal("csi-loop: --node, --dir and --endpoint are required")
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		log.Fatal(err)
	}
	servers := []*grpc.Server{serve(d.endpoint, func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, d)
		csi.RegisterControllerServer(s, d)
		csi.RegisterNodeServer(s, d)
	})}
	if *registry != "" {
		socket := filepath.Join(*registry, d.name+"-reg.sock")
		servers = append(servers, serve(socket, func(s *grpc.Server) { registration.RegisterRegistrationServer(s, d) }))
	}
	log.Printf("csi-loop: %s serving node %s at %s", d.name, d.node, d.endpoint)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	for _, s := range servers {
		s.Stop()
	}
}

// serve listens on the unix socket `path` (replacing a stale one) with what `register` adds.
func serve(path string, register func(*grpc.Server)) *grpc.Server {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		log.Fatal(err)
	}
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(logged))
	register(s)
	go func() { _ = s.Serve(listener) }()
	return s
}

func logged(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		log.Printf("%s: %v", info.FullMethod, err)
	} else if !strings.Contains(info.FullMethod, "Probe") && !strings.Contains(info.FullMethod, "GetCapabilities") {
		log.Printf("%s: ok", info.FullMethod)
	}
	return resp, err
}

// The kubelet's plugin registration.

func (d *driver) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{Type: registration.CSIPlugin, Name: d.name, Endpoint: d.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (d *driver) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Printf("csi-loop: the kubelet refused the registration: %s", s.Error)
	}
	return &registration.RegistrationStatusResponse{}, nil
}

// Identity.

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "1"}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	online := &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{
		service(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		online,
	}}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// Controller: volumes are made and removed on the node that keeps them.

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	create := &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
		Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{create}}, nil
}

func (d *driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{d.name + "/node": d.node}}
}

func (d *driver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.Name == "" || strings.ContainsAny(req.Name, "/.") {
		return nil, status.Errorf(codes.InvalidArgument, "volume name %q", req.Name)
	}
	for _, c := range req.VolumeCapabilities {
		if c.GetMount() == nil {
			return nil, status.Error(codes.InvalidArgument, "only filesystem volumes")
		}
		if fs := c.GetMount().FsType; fs != "" && fs != "xfs" {
			return nil, status.Errorf(codes.InvalidArgument, "filesystem %q: only xfs grows online here", fs)
		}
	}
	size := max(req.GetCapacityRange().GetRequiredBytes(), minBytes)
	d.mu.Lock()
	defer d.mu.Unlock()
	file := d.file(req.Name)
	if info, err := os.Stat(file); err == nil {
		size = info.Size()
	} else {
		if err := create(file, size); err != nil {
			_ = os.Remove(file)
			return nil, status.Errorf(codes.Internal, "creating %s: %v", file, err)
		}
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:           req.Name,
		CapacityBytes:      size,
		AccessibleTopology: []*csi.Topology{d.topology()},
	}}, nil
}

// create makes `file` a sparse file of `size` bytes holding an empty XFS.
func create(file string, size int64) error {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if closed := f.Close(); err == nil {
		err = closed
	}
	if err != nil {
		return err
	}
	return run("mkfs.xfs", "-q", file)
}

func (d *driver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.VolumeId == "" || strings.ContainsAny(req.VolumeId, "/.") {
		return nil, status.Errorf(codes.InvalidArgument, "volume id %q", req.VolumeId)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	file := d.file(req.VolumeId)
	if dev, _ := loopOf(file); dev != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is attached at %s", req.VolumeId, dev)
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", file, err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// Node.

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.node, AccessibleTopology: d.topology()}, nil
}

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	rpc := func(t csi.NodeServiceCapability_RPC_Type) *csi.NodeServiceCapability {
		return &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}}
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{
		rpc(csi.NodeServiceCapability_RPC_EXPAND_VOLUME),
		rpc(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS),
	}}, nil
}

func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target := req.TargetPath
	if target == "" || req.GetVolumeCapability().GetMount() == nil {
		return nil, status.Error(codes.InvalidArgument, "a target path and a filesystem volume are required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	file := d.file(req.VolumeId)
	if _, err := os.Stat(file); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s: %v", req.VolumeId, err)
	}
	if mounted(target) {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	dev, err := attach(file)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "attaching %s: %v", file, err)
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	options := append([]string{}, req.GetVolumeCapability().GetMount().MountFlags...)
	if req.Readonly {
		options = append(options, "ro")
	}
	args := []string{"-t", "xfs"}
	if len(options) > 0 {
		args = append(args, "-o", strings.Join(options, ","))
	}
	if err := run("mount", append(args, dev, target)...); err != nil {
		return nil, status.Errorf(codes.Internal, "mounting %s: %v", req.VolumeId, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if mounted(req.TargetPath) {
		if err := run("umount", req.TargetPath); err != nil {
			return nil, status.Errorf(codes.Internal, "unmounting %s: %v", req.TargetPath, err)
		}
	}
	if err := os.Remove(req.TargetPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if dev, _ := loopOf(d.file(req.VolumeId)); dev != "" {
		if err := run("losetup", "-d", dev); err != nil {
			return nil, status.Errorf(codes.Internal, "detaching %s: %v", dev, err)
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (d *driver) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	file := d.file(req.VolumeId)
	info, err := os.Stat(file)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s: %v", req.VolumeId, err)
	}
	size := max(info.Size(), req.GetCapacityRange().GetRequiredBytes())
	if err := os.Truncate(file, size); err != nil {
		return nil, status.Errorf(codes.Internal, "extending %s: %v", file, err)
	}
	dev, err := loopOf(file)
	if err != nil || dev == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not attached here", req.VolumeId)
	}
	if err := run("losetup", "-c", dev); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := run("xfs_growfs", req.VolumePath); err != nil {
		return nil, status.Errorf(codes.Internal, "growing %s: %v", req.VolumePath, err)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

func (d *driver) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(req.VolumePath, &fs); err != nil {
		return nil, status.Errorf(codes.NotFound, "%s: %v", req.VolumePath, err)
	}
	block := fs.Bsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(fs.Blocks) * block, Available: int64(fs.Bavail) * block, Used: int64(fs.Blocks-fs.Bfree) * block},
		{Unit: csi.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
	}}, nil
}

func (d *driver) file(volume string) string {
	return filepath.Join(d.dir, volume+".img")
}

// attach gives `file` a loop device, or the one it has.
func attach(file string) (string, error) {
	if dev, err := loopOf(file); err != nil || dev != "" {
		return dev, err
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// loopOf is the loop device `file` is attached to, if any.
func loopOf(file string) (string, error) {
	out, err := exec.Command("losetup", "--noheadings", "--output", "NAME", "--associated", file).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup: %v: %s", err, out)
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]), nil
}

func mounted(path string) bool {
	return exec.Command("mountpoint", "-q", path).Run() == nil
}

func run(program string, args ...string) error {
	out, err := exec.Command(program, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", program, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
