from kerneldev.sandbox_service.app import main

main()
